"""Admission by Content-Length (queen_pg/api/shared/admission.py) and 507 storage_full (queen_pg/jobs/storage.py),
over real HTTP against a real broker: a small byte budget held by slow bodies refuses the next push with
429 + Retry-After and admits it again once the budget frees; a tiny database byte budget refuses pushes
with 507 while pops, acks and ack-only transactions still drain the backlog."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from pydantic import ValidationError

from queen_pg.settings import Settings
from tests.helpers import eventually, push, push_at

BODY = 512 * 1024  # the largest body; the budget of 1 MiB holds exactly two
SMALL = {"admit_max_mb": 1, "max_body_bytes": BODY}

RETRY_AFTER = set(range(1, 6))  # seconds a 429 may ask a client to wait (1-5)


class SlowBody:
    """A push whose Content-Length is announced at once and whose body is held back until released."""

    def __init__(self, http: httpx.AsyncClient, queue: str) -> None:
        self.release = asyncio.Event()
        head = f'{{"items":[{{"queue":"{queue}","payload":1}}]}}'.encode()
        self.head, self.pad = head, b" " * (BODY - len(head))
        self.task = asyncio.create_task(
            http.post(
                "/api/v1/push",
                content=self._chunks(),
                headers={"content-length": str(BODY), "content-type": "application/json"},
            )
        )

    async def _chunks(self) -> AsyncIterator[bytes]:
        yield self.head
        await self.release.wait()
        yield self.pad

    async def finish(self) -> httpx.Response:
        self.release.set()
        return await self.task


async def oversized(port: int) -> bytes:
    """A push announcing a body over the limit, sent on a raw socket (httpx refuses to under-send)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    n = BODY + 1
    head = f"POST /api/v1/push HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {n}"
    writer.write(head.encode() + b"\r\n\r\n{")
    await writer.drain()
    answer = await reader.read()  # the broker closes the connection after refusing
    writer.close()
    await writer.wait_closed()
    return answer


def small_push(queue: str) -> dict[str, Any]:
    return {"items": [{"queue": queue, "payload": "x"}]}


async def test_full_budget_answers_429_with_retry_after_then_admits(start_broker: Any) -> None:
    b = await start_broker(admit_hold_ms=300, **SMALL)
    budget = b.app.state.queen.admission
    assert budget.capacity == 2 * BODY
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        holders = [SlowBody(http, "slow"), SlowBody(http, "slow")]
        await eventually(lambda: budget.sem.used == 2 * BODY, "two slow bodies to hold the whole budget")
        r = await http.post("/api/v1/push", json=small_push("fast"))
        assert r.status_code == 429, r.text
        assert r.json()["code"] == "overloaded" and r.json()["error"]
        assert int(r.headers["Retry-After"]) in RETRY_AFTER
        assert budget.sem.used == 2 * BODY and budget.sem.queued == 0  # the refused one took nothing
        first = await holders[0].finish()
        assert first.status_code == 201, first.text
        await eventually(lambda: budget.sem.used == BODY, "the answered push to give its permits back")
        r = await http.post("/api/v1/push", json=small_push("fast"))
        assert r.status_code == 201, r.text
        second = await holders[1].finish()
        assert second.status_code == 201, second.text
    await eventually(lambda: budget.sem.used == 0, "every permit back")
    assert budget.snapshot()["rejected_total"] == 1
    rows = await b.app.state.queen.db.fetch(
        "SELECT q.name, count(*) AS n FROM queen.log_txns t JOIN "
        "queen.log_partitions p ON p.id = t.partition_id JOIN queen.queues q "
        "ON q.id = p.queue_id GROUP BY q.name ORDER BY q.name"
    )
    assert [(r["name"], r["n"]) for r in rows] == [("fast", 1), ("slow", 2)]


async def test_a_push_waits_for_admission_within_the_hold(start_broker: Any) -> None:
    b = await start_broker(admit_hold_ms=20_000, **SMALL)
    budget = b.app.state.queen.admission
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        holders = [SlowBody(http, "slow"), SlowBody(http, "slow")]
        await eventually(lambda: budget.sem.used == 2 * BODY, "two slow bodies to hold the whole budget")
        # an oversized body is 413 at once: BodyLimit runs before admission, so it never queues for permits
        answer = await oversized(b.port)
        assert answer.startswith(b"HTTP/1.1 413") and b"body_too_large" in answer, answer
        waiting = asyncio.create_task(http.post("/api/v1/push", json=small_push("fast")))
        await eventually(lambda: budget.sem.queued == 1, "the next push to wait for admission")
        assert not waiting.done()
        assert (await holders[0].finish()).status_code == 201
        r = await waiting
        assert r.status_code == 201, r.text
        assert (await holders[1].finish()).status_code == 201
    await eventually(lambda: budget.sem.used == 0, "every permit back")


def test_the_budget_must_hold_two_of_the_largest_bodies() -> None:
    assert Settings().admit_max_mb * 1024 * 1024 >= 128 * 1024 * 1024
    with pytest.raises(ValidationError, match="at least 2 x max_body_bytes = 128 MiB"):
        Settings(admit_max_mb=127)
    with pytest.raises(ValidationError, match="at least 2 x max_body_bytes = 2 MiB"):
        Settings(admit_max_mb=1, max_body_bytes=BODY + 1)
    assert Settings(**SMALL).admit_max_mb == 1
    with pytest.raises(ValidationError, match="limiter_min"):
        Settings(limiter_min=10, limiter_max=5)


async def test_storage_full_refuses_pushes_but_serves_pops_and_acks(
    start_broker: Any, conn: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="queen_pg.jobs")
    await push_at(conn, "backlog", ["t1", "t2"], None)
    b = await start_broker(db_max_bytes=1)
    queen = b.app.state.queen
    assert await queen.storage.refresh(queen.db) is True  # computed now, not on the job's next tick
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        r = await http.post("/api/v1/push", json=small_push("backlog"))
        assert r.status_code == 507, r.text
        assert r.json()["code"] == "storage_full" and "budget 1" in r.json()["error"]
        r = await http.post(
            "/api/v1/transaction",
            json={"operations": [{"type": "push", "items": [{"queue": "backlog", "payload": 3}]}]},
        )
        assert (r.status_code, r.json()["code"]) == (507, "storage_full")
        r = await http.get("/api/v1/pop/queue/backlog", params={"consumerGroup": "g", "batch": 10})
        assert r.status_code == 200, r.text
        msgs = r.json()["messages"]
        assert [m["transactionId"] for m in msgs] == ["t1", "t2"]
        r = await http.post(
            "/api/v1/ack",
            json={
                "transactionId": "t1",
                "partitionId": msgs[0]["partitionId"],
                "leaseId": msgs[0]["leaseId"],
                "consumerGroup": "g",
                "status": "completed",
            },
        )
        assert r.status_code == 200 and r.json()[0]["success"] is True, r.text
        r = await http.post(
            "/api/v1/transaction",
            json={
                "operations": [
                    {
                        "type": "ack",
                        "transactionId": "t2",
                        "partitionId": msgs[1]["partitionId"],
                        "leaseId": msgs[1]["leaseId"],
                        "consumerGroup": "g",
                    }
                ]
            },
        )
        assert r.status_code == 200 and r.json()["success"] is True, r.text
        r = await http.get("/api/v1/pop/queue/backlog", params={"consumerGroup": "g"})
        assert r.status_code == 204  # drained
        # the budget is raised: the next refresh clears the flag and pushes are served again
        queen.storage.db_max_bytes = 10**15
        assert await queen.storage.refresh(queen.db) is False
        await push(http, "backlog", [{"payload": 4}])
    assert await conn.fetchval("SELECT count(*) FROM queen.log_txns") == 3  # the refused writes wrote nothing
    lines = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("event=storage_full") for m in lines) == 1, lines  # boot + refresh: one transition
    assert sum(m.startswith("event=storage_ok") for m in lines) == 1, lines


async def test_a_large_byte_budget_serves_pushes(start_broker: Any) -> None:
    b = await start_broker(db_max_bytes=10**15)
    queen = b.app.state.queen
    assert await queen.storage.refresh(queen.db) is False
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        res = await push(http, "q", [{"payload": 1}])
    assert res[0]["status"] == "queued"


async def test_disk_above_the_high_mark_refuses_pushes(start_broker: Any, tmp_path: Path) -> None:
    full = await start_broker(disk_path=tmp_path, disk_high_pct=0.001)  # any disk in use is above 0.001 %
    roomy = await start_broker(disk_path=tmp_path, disk_high_pct=100)
    for b in (full, roomy):
        await b.app.state.queen.storage.refresh(b.app.state.queen.db)
    async with httpx.AsyncClient(base_url=full.url, timeout=30) as http:
        r = await http.post("/api/v1/push", json=small_push("q"))
        assert (r.status_code, r.json()["code"]) == (507, "storage_full")
        assert f"disk of {tmp_path}" in r.json()["error"]
    async with httpx.AsyncClient(base_url=roomy.url, timeout=30) as http:
        await push(http, "q", [{"payload": 1}])
