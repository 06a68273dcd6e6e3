"""The benchmark harness works: its load generator drives a real broker over HTTP and its report is
sound. Nothing here asserts a speed: ``make bench`` measures, tests only check the measuring."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from benchmarks import pair
from benchmarks import run as bench
from benchmarks.broker import BenchError
from benchmarks.context import full_window
from benchmarks.machine import RESULTS, git_state, result_path
from benchmarks.peers import pgmq
from benchmarks.profiling import summarize
from benchmarks.scenarios import Context, Metric
from tests.conftest import Broker, PgServer, free_port
from tests.helpers import fetchval_once


async def run_bench(tmp_path: Path, *argv: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "results.json"
    rc = await asyncio.to_thread(bench.main, [*argv, "--output", str(out)])
    return rc, (json.loads(out.read_text()) if out.exists() else {})


def metric(row: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in row["metrics"] if m["name"] == name)


async def test_push_scenario_and_memory_against_a_running_broker(
    broker: Broker, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    rc, res = await run_bench(
        tmp_path, "--broker-url", broker.url, "--broker-pid", str(os.getpid()),
        "--scenarios", "push_single,memory", "--runs", "1", "--duration", "1", "--warmup", "0.2",
    )  # fmt: skip
    assert rc == 0, res
    push, mem = res["scenarios"]
    assert push["key"] == "push_single" and push["error"] is None
    assert metric(push, "msg_s")["median"] > 0
    # its target is a ratio to pgmq measured in the same sitting: without the peers scenario, none is made up
    (link,) = push["vs_peer"]
    assert link["peer_metric"] == "push_single_msg_s" and link["peer"] is None and link["met"] is None
    assert push["met"] is None
    details = push["runs"][0]["details"]
    assert details["errors"] == 0 and details["count"] > 0
    assert details["cpu_cores"]["broker"] > 0  # the broker (this process) worked during the window
    assert mem["key"] == "memory" and metric(mem, "rss_mb")["median"] > 0
    assert res["machine"]["cores"] >= 1 and res["machine"]["python"]
    # the queue the scenario pushed to was deleted after its run
    assert await conn.fetchval("SELECT count(*) FROM queen.queues WHERE name LIKE 'bench-%'") == 0


async def test_pop_ack_prefills_for_the_whole_window_after_a_calibration(broker: Broker, tmp_path: Path) -> None:
    rc, res = await run_bench(
        tmp_path, "--broker-url", broker.url, "--scenarios", "pop_ack", "--pop-prefill", "2000",
        "--runs", "1", "--duration", "0.5", "--warmup", "0",
    )  # fmt: skip
    assert rc == 0, res
    (row,) = res["scenarios"]
    sizing = row["prefill"]["pop_ack"]
    # the calibration consumed its whole pre-fill, every message acknowledged exactly once
    assert sizing["calibration"]["prefill"]["count"] == 2000 and sizing["calibration"]["per_group"] == [2000]
    assert sizing["messages"] >= 2000
    details = row["runs"][0]["details"]
    assert details["ran_dry"] is False and details["elapsed_s"] >= 0.49  # the window ran its full length
    assert details["prefill"]["count"] >= sizing["messages"] // 2  # (a dry run is redone with twice as many)
    assert details["per_group"][0] + details["left_per_group"][0] == details["prefill"]["count"]
    assert details["errors"] == 0
    assert metric(row, "msg_s")["median"] > 0
    assert set(row["cores"][""]) == {"broker", "postgres", "loadgen", "other", "window_s"}


async def test_pgmq_peer_installs_in_a_throwaway_database_and_round_trips(pg_server: PgServer) -> None:
    """The peer's SQL installs into a database of its own, and its load generator's fill and consume
    (send_batch, read, delete) move every message once."""
    name = f"bench_pgmq_{os.getpid()}"
    dsn = await asyncio.to_thread(pgmq.install, pg_server.admin_url, name)
    try:
        await asyncio.to_thread(pgmq._queue_sql, dsn, "SELECT pgmq.create(%s)", "rt")
        ctx = Context(url="", root_pid=None, duration=5, warmup=0, tag="t", pop_prefill=0)
        base = {"dsn": dsn, "queue": "rt", "max_conns": 4}
        fill = await asyncio.to_thread(
            ctx.setup, base | {"action": "fill", "total": 250, "per_req": 100, "concurrency": 2}, pgmq.LOADGEN
        )
        assert fill["count"] == 250
        spec = base | {"action": "consume", "consumers": 2, "batch": 100, "expect": 250}
        got = await asyncio.to_thread(ctx.measure, spec, "", pgmq.LOADGEN)
        assert got["ran_dry"] is True and got["per_group"] == [250] and got["errors"] == 0
        assert await fetchval_once(dsn, "SELECT count(*) FROM pgmq.q_rt") == 0  # every message read was deleted
    finally:
        await asyncio.to_thread(pgmq.drop, pg_server.admin_url, name)


async def test_unreachable_broker_is_an_error_not_a_hang(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    rc, res = await run_bench(tmp_path, "--broker-url", url, "--scenarios", "push_single", "--runs", "1")
    assert rc == 1
    assert res == {}  # no results file for a run that could not start


async def test_unknown_scenario_is_refused(tmp_path: Path) -> None:
    rc, _res = await run_bench(tmp_path, "--scenarios", "push_single,nope")
    assert rc == 2


async def test_pair_alternates_its_blocks_and_every_request_lands(broker: Broker, conn: asyncpg.Connection) -> None:
    order: list[int] = []

    def cpu(pid: int) -> dict[str, float]:  # the process tree's CPU; records which side a block measured
        order.append(pid)
        return pair.tree_cpu(os.getpid())

    a, b = pair.Side(broker.url, 1), pair.Side(broker.url, 2)  # one broker as both sides, told apart by pid
    res = await asyncio.to_thread(pair.run_pair, a, b, "push", 3, 5, cpu)
    assert order[::2] == order[1::2] == [1, 2, 2, 1, 1, 2]  # A B, B A, A B: a before and after per block
    for side in "AB":
        runs = res["sides"][side]["runs"]
        assert len(runs) == 3 and all(r["p50_ms"] > 0 and r["broker_us"] >= 0 for r in runs)
        assert res["sides"][side]["p50_ms"] == sorted(r["p50_ms"] for r in runs)[1]  # the median block
    assert 0 <= res["b_cheaper"] <= 3 and 0 <= res["b_faster"] <= 3
    stored = await conn.fetchval(
        "SELECT sum(p.next_offset) FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id"
        " WHERE q.name = 'pair-bench'"
    )
    assert stored == 2 * 3 * 5  # every push of every block was stored, none twice
    miss = await asyncio.to_thread(pair.block, a, "miss", 3)  # a 404 is what a miss must answer
    assert miss["p50_ms"] > 0


async def test_pair_block_stops_at_an_answer_it_did_not_expect(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(pair.REQUESTS, "lost", ("GET", "/no/such/route", None))  # expects 2xx, gets 404
    with pytest.raises(RuntimeError, match="answered 404"):
        await asyncio.to_thread(pair.block, pair.Side(broker.url, os.getpid()), "lost", 3)
    with pytest.raises(OSError):  # nothing listens there
        await asyncio.to_thread(pair.block, pair.Side(f"http://127.0.0.1:{free_port()}", os.getpid()), "health", 1)


def test_pair_cli_refuses_a_tree_without_its_venv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        pair.main(["--a", str(tmp_path)])
    assert exc.value.code == 2 and "has no .venv/bin/python" in capsys.readouterr().err


def test_targets_are_judged_in_their_direction() -> None:
    at_least = bench.judge(Metric("msg_s", "msg/s", 8000), 6000.0)
    assert at_least["met"] is False and at_least["of_target"] == 0.75
    assert bench.judge(Metric("msg_s", "msg/s", 8000), 9000.0)["met"] is True
    at_most = bench.judge(Metric("p99_ms", "ms", 5.0, "<="), 7.5)
    assert at_most["met"] is False and at_most["of_target"] == 1.5
    assert bench.judge(Metric("p99_ms", "ms", 5.0, "<="), 4.0)["met"] is True
    assert bench.judge(Metric("single_msg_s", "msg/s"), 10.0)["met"] is None  # informational, no target


def test_a_dry_pop_run_is_redone_with_twice_the_messages_and_never_quoted_twice() -> None:
    ctx = Context(url="", root_pid=None, duration=5, warmup=1, tag="t", pop_prefill=10_000)
    calls: list[tuple[int, str]] = []
    dry_until = [2]  # the calibration and the first run drain; the redone run does not

    def pop_run(messages: int, label: str, overrides: dict[str, Any]) -> dict[str, Any]:
        calls.append((messages, label))
        dry = len(calls) <= dry_until[0]
        return {"rate": 10_000.0, "count": messages, "elapsed_s": 1.0 if dry else 5.0, "ran_dry": dry}

    r = full_window(ctx, "k", 0, pop_run)
    # calibration: 10k msg/s x 6 s x 1.6 = 96k -> 100k; the dry run 0 is redone as "0b" with 200k
    assert calls == [(10_000, "cal"), (100_000, "0"), (200_000, "0b")]
    assert r["ran_dry"] is False and r["dry_attempt"]["count"] == 100_000
    dry_until[0] = 99  # every run drains: the scenario fails instead of quoting a drain
    with pytest.raises(BenchError, match="ran dry inside the measured window twice"):
        full_window(ctx, "k", 1, pop_run)


def test_ratios_to_the_peer_are_judged_and_tabled() -> None:
    def row(key: str, **medians: float) -> dict[str, Any]:
        ms = [bench.judge(m, medians.get(m.name)) for m in bench.BY_KEY[key].metrics]
        return {"key": key, "title": bench.BY_KEY[key].title, "error": None, "metrics": ms, "runs": []}

    rows = [row("push_batch100", msg_s=50_000.0), row("pop_ack_binary", msg_s=20_000.0),
            row("peers", push_batch100_msg_s=100_000.0, pop_ack_msg_s=40_000.0)]  # fmt: skip
    bench.link_peers(rows)
    push, pop, _peers = rows
    assert push["vs_peer"][0]["ratio"] == 0.5 and push["vs_peer"][0]["met"] is True and push["met"] is True  # ≥ 0.45
    assert pop["vs_peer"][0]["ratio"] == 0.5 and pop["vs_peer"][0]["met"] is False and pop["met"] is False  # ≥ 1.0
    md = bench.table(rows).splitlines()
    assert md[0] == "| scenario | ours | pgmq | ratio | target | met? |"
    assert md[2] == f"| {push['title']} | 50,000 msg/s | 100,000 msg/s | 0.50× | ≥ 0.45× pgmq | yes |"
    assert md[3].endswith("| 20,000 msg/s | 40,000 msg/s | 0.50× | ≥ 1.00× pgmq | no |")
    assert len(md) == 4  # the peers' own figures are the denominators, not lines


def test_profile_summary_reads_py_spy_collapsed_stacks(tmp_path: Path) -> None:
    f = tmp_path / "p.txt"
    f.write_text(
        'process 1:"python -m queen_pg.cli serve";<module> (queen_pg/cli.py:10);'
        "push (queen_pg/api/routes_data.py:60);fetch (asyncpg/connection.py:2069) 3\n"
        'process 1:"python -m queen_pg.cli serve";<module> (queen_pg/cli.py:10);'
        "push (queen_pg/api/routes_data.py:60);pack (queen_pg/engine/codec.py:58) 1\n"
    )
    s = summarize(f)
    assert s["samples"] == 4
    cats = dict(s["self_by_category"])
    assert cats["asyncpg (Cython protocol: encode arguments, send, decode rows; pool)"] == 75.0
    assert cats["queen_pg engine/codec.py"] == 25.0
    assert dict(s["inclusive"])["push (queen_pg/api/routes_data.py)"] == 100.0


def test_a_run_is_named_by_its_date_and_commit() -> None:
    """New results land in benchmarks/results/<date>-<commit>[-dirty][-<kind>].json: the file says what it measured."""
    commit, dirty = git_state()
    date = time.strftime("%Y-%m-%d", time.gmtime())
    stem = f"{date}-{commit}" + ("-dirty" if dirty else "")
    assert result_path() == RESULTS / f"{stem}.json"
    assert result_path("mesh") == RESULTS / f"{stem}-mesh.json"
    assert RESULTS.is_dir() and all(p.name[:10].count("-") == 2 for p in RESULTS.glob("*.json"))
