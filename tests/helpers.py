"""Small helpers shared by tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import httpx

from queen_pg.api.hot import HotTable, hot_routes


async def push(http: httpx.AsyncClient, queue: str, items: list[dict[str, Any]], partition: str = "Default") -> Any:
    body = {"items": [{"queue": queue, "partition": partition, **it} for it in items]}
    r = await http.post("/api/v1/push", json=body)
    assert r.status_code == 201, r.text
    return r.json()


async def pop(http: httpx.AsyncClient, queue: str, **params: Any) -> Any:
    path = f"/api/v1/pop/queue/{queue}"
    if "partition" in params:
        path += f"/partition/{params.pop('partition')}"
    q = {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in params.items()}
    r = await http.get(path, params=q)
    assert r.status_code in (200, 204), r.text
    return None if r.status_code == 204 else r.json()


def assert_error(r: httpx.Response, status: int, code: str) -> None:
    """An error answer: the status, the catalog's code and a message (docs/wire.md#errors)."""
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == code and isinstance(body["error"], str) and body["error"], body


async def configure(http: httpx.AsyncClient, queue: str, **options: Any) -> None:
    r = await http.post("/api/v1/configure", json={"queue": queue, "options": options})
    assert r.status_code == 200, r.text


async def ack_one(
    http: httpx.AsyncClient, m: dict[str, Any], group: str | None = None, status: str = "completed"
) -> dict[str, Any]:
    """One ack of a popped message under its lease, with an error text (a dead letter keeps it)."""
    body = {
        "transactionId": m["transactionId"],
        "partitionId": m["partitionId"],
        "leaseId": m["leaseId"],
        "status": status,
        "error": "boom",
        "consumerGroup": group,
    }
    r = await http.post("/api/v1/ack", json=body)
    assert r.status_code == 200
    item: dict[str, Any] = r.json()[0]
    return item


async def ack_batch(
    http: httpx.AsyncClient, messages: list[dict[str, Any]], group: str | None = None, status: str = "completed"
) -> Any:
    """One ``/ack/batch`` of popped messages under their leases; every item must succeed."""
    items = [
        {
            "transactionId": m["transactionId"],
            "partitionId": m["partitionId"],
            "leaseId": m["leaseId"],
            "status": status,
        }
        for m in messages
    ]
    r = await http.post("/api/v1/ack/batch", json={"acknowledgments": items, "consumerGroup": group})
    assert r.status_code == 200 and all(i["success"] for i in r.json()), r.text
    return r.json()


async def counts(conn: asyncpg.Connection) -> dict[str, int]:
    out = {}
    for table in ("queues", "log_partitions", "log_segments", "log_txns", "log_consumers", "log_groups", "log_dlq"):
        out[table] = await conn.fetchval(f"SELECT count(*) FROM queen.{table}")
    return out


EMPTY = {
    t: 0 for t in ("queues", "log_partitions", "log_segments", "log_txns", "log_consumers", "log_groups", "log_dlq")
}


async def fetchval_once(url: str, sql: str, *args: Any) -> Any:
    """One value read on a connection of its own (a database no fixture is connected to)."""
    c = await asyncpg.connect(url)
    try:
        return await c.fetchval(sql, *args)
    finally:
        await c.close()


@contextlib.asynccontextmanager
async def rolled_back(conn: asyncpg.Connection) -> AsyncIterator[None]:
    """A transaction on ``conn`` that is always rolled back: a procedure's effects read, then undone."""
    tr = conn.transaction()
    await tr.start()
    try:
        yield
    finally:
        await tr.rollback()


async def until(check: Callable[[], Awaitable[bool]], what: str = "condition", within: float = 10.0) -> None:
    """Like :func:`eventually` for a condition that must be asked for (a query, an HTTP probe): the
    state lives in another process (PostgreSQL, a broker subprocess), so there is no event to await."""
    try:
        async with asyncio.timeout(within):
            while not await check():  # noqa: ASYNC110 - the state lives in another process
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def _running() -> None:
    pass


async def until_healthy(url: str, what: str, within: float, alive: Callable[[], None] = _running) -> None:
    """Until ``GET {url}/health`` answers 200; ``alive`` asserts that the process behind it still runs."""

    async def healthy() -> bool:
        alive()
        try:
            async with httpx.AsyncClient(timeout=1) as c:
                return (await c.get(f"{url}/health")).status_code == 200
        except httpx.TransportError:
            return False

    await until(healthy, what, within)


async def eventually(predicate: Callable[[], bool], what: str = "condition", within: float = 10.0) -> None:
    """Await a condition that another task makes true (e.g. a pop parking), with a deadline."""
    try:
        async with asyncio.timeout(within):
            while not predicate():  # noqa: ASYNC110 - the state lives in another task; no event to await
                await asyncio.sleep(0.005)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def push_at(
    conn: asyncpg.Connection, queue: str, txns: list[str], now: Any, partition: str = "Default"
) -> list[asyncpg.Record]:
    """Push through queen.push_v1 with time passed in (payload = the transactionId as a JSON string)."""
    from queen_pg.engine import codec

    ids = [codec.uuid7() for _ in txns]
    frames = [codec.encode_frame(i, t, f'"{t}"'.encode(), None) for i, t in zip(ids, txns, strict=True)]
    return list(
        await conn.fetch(
            "SELECT * FROM queen.push_v1('default', $1, $2, $3, $4, $5, $6, $7)",
            [queue],
            [partition],
            [codec.pack(frames)],
            [1] * len(txns),
            [codec.txn_hash(t) for t in txns],
            ids,
            now,
        )
    )


POP_AT = (
    "SELECT * FROM queen.pop_v1('default', $1, NULL, NULL, NULL, $2, 100, 10, gen_random_uuid(), $3, NULL, NULL, $4)"
)


async def pop_at(conn: asyncpg.Connection, queue: str, now: Any, group: str = "g", auto_ack: bool = True) -> list[Any]:
    """Offsets claimed by queen.pop_v1 at time ``now``."""
    rows = await conn.fetch(POP_AT, queue, group, auto_ack, now)
    out: list[Any] = []
    for r in rows:
        out.extend(o for o in range(max(r["base_offset"], r["lease_start"]), min(r["end_offset"], r["lease_end"])))
    return out


@contextlib.asynccontextmanager
async def hot_client(broker: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``broker`` that checks, at the end, that the protocol (queen_pg/api/hot.py: HotPath) and
    not the app answered every request it sent to a hot route: tests using it exercise the hot path."""
    hot = broker.app.state.queen.transport.hot
    assert hot is not None, "the broker runs with QUEEN_HOT_PROTOCOL=0"
    table = HotTable(hot_routes())
    sent = 0

    async def count(request: httpx.Request) -> None:
        nonlocal sent
        scope = {"type": "http", "method": request.method, "path": request.url.path, "root_path": ""}
        sent += table.find(scope) is not None

    before = hot.served
    async with httpx.AsyncClient(base_url=broker.url, timeout=30, event_hooks={"request": [count]}) as client:
        yield client
    assert hot.served - before == sent, (hot.served - before, sent)
