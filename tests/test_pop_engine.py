"""Pop engine edges with a controlled clock: the claim margin before the caller's deadline."""

from __future__ import annotations

import asyncio

import asyncpg
import orjson

from queen_pg.db.pool import Database
from queen_pg.engine import pop as pop_engine
from queen_pg.engine import push as push_engine
from queen_pg.engine.pop_render import RenderedPop
from queen_pg.engine.waiters import Waiters
from tests.helpers import eventually


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def request(timeout_ms: int) -> pop_engine.PopRequest:
    return pop_engine.PopRequest(
        queue="m",
        namespace=None,
        task=None,
        partition=None,
        group=None,
        batch=10,
        partitions=1,
        wait=True,
        timeout_ms=timeout_ms,
        auto_ack=False,
        subscription_mode=None,
        subscription_from=None,
        autopilot=False,
    )


async def _wake_at(db: Database, conn: asyncpg.Connection, at: float) -> tuple[object, object]:
    waiters, clock = Waiters(10), Clock()
    await push_engine.push(db, "default", [push_engine.NewMessage("m", "p", b"0", "seed", None)])
    await pop_engine.claim(db, "default", request(0))  # lease the seed so the next pop parks
    task = asyncio.create_task(pop_engine.pop(db, waiters, "default", request(1000), 3600, clock))
    await eventually(lambda: waiters.parked == 1, "the pop to park")
    clock.now = at  # time passes while parked ...
    await push_engine.push(db, "default", [push_engine.NewMessage("m", "p2", b"1", "late", None)])
    waiters.notify("default", "m")  # ... and a push wakes it
    answer = await asyncio.wait_for(task, 10)
    lease = await conn.fetchval(
        "SELECT lease_id FROM queen.log_consumers c JOIN queen.log_partitions p ON p.id = c.partition_id "
        "WHERE p.name = 'p2'"
    )
    return answer, lease


async def test_wake_inside_the_margin_claims_nothing(db: Database, conn: asyncpg.Connection) -> None:
    # timeout 1 s: the margin is min(250 ms, 1 s / 4) = 250 ms, so claiming stops at 0.75 s
    answer, lease = await _wake_at(db, conn, 0.76)
    assert answer is None and lease is None  # nothing was leased that nobody would receive


async def test_wake_before_the_margin_claims(db: Database, conn: asyncpg.Connection) -> None:
    answer, lease = await _wake_at(db, conn, 0.74)
    assert isinstance(answer, RenderedPop)  # rendered to bytes (queen_pg/engine/pop_render.py)
    assert [m["transactionId"] for m in orjson.loads(answer.body)["messages"]] == ["late"]
    assert lease is not None
