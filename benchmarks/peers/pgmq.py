"""The ``peers`` scenario: pgmq 1.5.1 (``third_party/pgmq-1.5.1.sql``, PostgreSQL License, unchanged) in a
throwaway database of the PostgreSQL the harness started, driven over asyncpg on our shapes, with our
client counts, durations and 128-byte payload (``benchmarks/peers/pgmq_load.py``):

- ``push_batch100``: 32 callers, ``pgmq.send_batch`` of 100 messages. It is also the peer of our binary
  push: pgmq has no binary wire, and a batch of the same payload bytes is the same call.
- ``push_single``: 128 callers, ``pgmq.send`` of one message (over at most as many connections as the
  server has spare: the result records ``connections``).
- ``pop_ack``: one queue pre-filled as ours are (calibrated, ``benchmarks/context.py``), 10 consumers
  loop ``pgmq.read(vt 30 s, 100)`` + ``pgmq.delete`` of the batch's ids. The peer of both our pop + ack
  and framed pop + ack.
- ``latency``: one caller, sequential ``pgmq.send``: p50 and p99.

Each shape gets a fresh queue (``pgmq.create``), dropped after its run; the database is dropped with
the scenario. pgmq needs no broker: its client talks SQL to PostgreSQL, so the ``broker`` cores of
these runs are the idle broker's and the load generator's are pgmq's client side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from benchmarks.broker import BenchError
from benchmarks.context import Context, Details, Metric, Values, full_window, rate

SQL_FILE = Path(__file__).resolve().parent / "third_party" / "pgmq-1.5.1.sql"
DATABASE = "bench_pgmq"
LOADGEN = "benchmarks.peers.pgmq_load"
SPARE_CONNECTIONS = 10  # left to the broker's pools (idle while pgmq runs, but they may open one)

METRICS = (
    Metric("push_batch100_msg_s", "msg/s"),
    Metric("push_single_msg_s", "msg/s"),
    Metric("pop_ack_msg_s", "msg/s"),
    Metric("latency_p50_ms", "ms"),
    Metric("latency_p99_ms", "ms"),
)


def with_database(dsn: str, database: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path="/" + database))


def install(admin_dsn: str, database: str = DATABASE) -> str:
    """Create ``database`` (a fresh one: an old one of that name is dropped) and install pgmq's SQL in it;
    returns its DSN (``admin_dsn``'s role)."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{database}"')
    dsn = with_database(admin_dsn, database)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SQL_FILE.read_text())  # one script, no parameters: the simple query protocol
    return dsn


def drop(admin_dsn: str, database: str = DATABASE) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def spare_connections(dsn: str) -> int:
    """Connections the server can still give a client without refusing the broker's."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int"
            " - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
        ).fetchone()
    return max(1, (row[0] if row else 1) - SPARE_CONNECTIONS)


def _queue_sql(dsn: str, sql: str, queue: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql, (queue,))


def peers_setup(ctx: Context) -> None:
    if ctx.pg_admin_dsn is None:
        raise BenchError("the peers scenario needs the PostgreSQL of a broker started by the harness")
    dsn = ctx.shared["pgmq_dsn"] = install(ctx.pg_admin_dsn)
    ctx.shared["max_conns"] = spare_connections(dsn)


def peers_teardown(ctx: Context) -> None:
    if ctx.pg_admin_dsn is not None:
        drop(ctx.pg_admin_dsn)
    ctx.shared.clear()


def _on_fresh_queue(ctx: Context, name: str, spec: dict[str, Any], fill: int = 0) -> dict[str, Any]:
    """Create pgmq queue ``name``, pre-fill ``fill`` messages (100 per send_batch, untimed), run ``spec``
    on it, drop it."""
    dsn = ctx.shared["pgmq_dsn"]
    base = {"dsn": dsn, "queue": name, "max_conns": ctx.shared["max_conns"]}
    _queue_sql(dsn, "SELECT pgmq.create(%s)", name)
    try:
        prefill = None
        if fill:
            prefill = ctx.setup(base | {"action": "fill", "total": fill, "per_req": 100, "concurrency": 10}, LOADGEN)
            if prefill["count"] != fill:
                raise BenchError(f"pgmq pre-fill of {name}: {prefill['count']} of {fill} messages sent")
            spec = spec | {"expect": prefill["count"]}
        r = ctx.measure(base | spec, f"-{name}", LOADGEN)
        return r | {"prefill": prefill} if prefill else r
    finally:
        _queue_sql(dsn, "SELECT pgmq.drop_queue(%s)", name)


def peers(ctx: Context, run: int) -> tuple[Values, Details]:
    push100 = _on_fresh_queue(ctx, f"push100_{run}", {"action": "push", "clients": 32, "items": 100})
    push1 = _on_fresh_queue(ctx, f"push1_{run}", {"action": "push", "clients": 128, "items": 1})

    def pop_run(messages: int, label: str, overrides: dict[str, Any]) -> dict[str, Any]:
        spec = {"action": "consume", "consumers": 10, "batch": 100} | overrides
        return _on_fresh_queue(ctx, f"pop_{label}", spec, fill=messages)

    pop = full_window(ctx, "peers.pop_ack", run, pop_run)
    lat = _on_fresh_queue(ctx, f"latency_{run}", {"action": "latency"})
    lat_ms = lat.get("latency_ms") or {}
    values = {
        "push_batch100_msg_s": rate(push100),
        "push_single_msg_s": rate(push1),
        "pop_ack_msg_s": rate(pop),
        "latency_p50_ms": lat_ms.get("p50", float("nan")),
        "latency_p99_ms": lat_ms.get("p99", float("nan")),
    }
    return values, {"push_batch100": push100, "push_single": push1, "pop_ack": pop, "latency": lat}  # fmt: skip
