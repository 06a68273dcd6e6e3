"""An ack that leaves a partition claimable wakes the pops parked on its queue, as a push does.

A long-poll pop parked on a queue whose only partition another consumer holds used to wait for its
re-check (QUEEN_POP_POLL_MAX_MS) after that consumer acked: only pushes woke parked pops. Now an ack,
a batch ack, a nack, a transaction's acks and a lease given back on disconnect that leave a cursor row
claimable (no live lease, messages at or above the cursor) wake them, locally and over the mesh. The
brokers here re-check once a minute and their pops wait 30 s at most, so only the wake answers them.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx

from queen_pg.api.shared.items import AckItem
from queen_pg.db.pool import Database
from queen_pg.engine import pop as pop_engine
from queen_pg.engine.ack import ack_many
from queen_pg.engine.fusion import FuseConfig, Fuser
from queen_pg.engine.leases import book_of
from queen_pg.engine.outcomes import once
from queen_pg.engine.waiters import Waiters
from tests.conftest import Broker, free_port
from tests.helpers import eventually, push, until
from tests.replicas import Replica

SLOW = {"pop_poll_interval_ms": 60_000, "pop_poll_max_ms": 600_000, "jobs_enabled": False}
LONG = {"wait": "true", "timeout": 30_000}


def _waiters(b: Broker) -> Waiters:
    w: Waiters = b.app.state.queen.waiters
    return w


async def _leased(http: httpx.AsyncClient, queue: str, n: int, batch: int) -> dict[str, Any]:
    """A queue with one partition of ``n`` messages, ``batch`` of them leased by a first consumer."""
    r = await http.post("/api/v1/configure", json={"queue": queue, "options": {"leaseTime": 300}})
    assert r.status_code == 200
    await push(http, queue, [{"payload": i} for i in range(n)])
    r = await http.get(f"/api/v1/pop/queue/{queue}", params={"batch": batch})
    assert r.status_code == 200
    got: dict[str, Any] = r.json()
    assert len(got["messages"]) == batch
    return got


def _acks(got: dict[str, Any], status: str = "completed", k: int | None = None) -> list[dict[str, Any]]:
    keys = ("transactionId", "partitionId", "leaseId")
    return [{**{key: m[key] for key in keys}, "status": status} for m in got["messages"][:k]]


async def _park(http: httpx.AsyncClient, b: Broker, queue: str) -> asyncio.Task[httpx.Response]:
    w = _waiters(b)
    parked = w.parked
    task = asyncio.create_task(http.get(f"/api/v1/pop/queue/{queue}", params={**LONG, "batch": 10}))
    await eventually(lambda: w.parked == parked + 1, "the long-poll pop to park")
    return task


async def test_a_batch_ack_that_releases_the_lease_wakes_the_parked_pop(start_broker: Any) -> None:
    b: Broker = await start_broker(**SLOW)
    async with httpx.AsyncClient(base_url=b.url, timeout=60) as http:
        got = await _leased(http, "relay", 5, 3)
        waiting = await _park(http, b, "relay")
        # a part of the lease: still held, nothing claimable, the pop stays parked
        r = await http.post("/api/v1/ack/batch", json={"acknowledgments": _acks(got, k=2)})
        assert r.status_code == 200 and [x["leaseReleased"] for x in r.json()] == [False, False]
        assert not waiting.done() and _waiters(b).parked == 1
        # the rest releases it with messages left: the parked pop gets them at once
        r = await http.post("/api/v1/ack/batch", json={"acknowledgments": _acks(got)[2:]})
        assert r.status_code == 200 and r.json()[-1]["leaseReleased"]
        answer = await waiting
    assert answer.status_code == 200
    assert [m["data"] for m in answer.json()["messages"]] == [3, 4]


async def test_a_nack_wakes_the_parked_pop_with_the_message_again(start_broker: Any) -> None:
    b: Broker = await start_broker(**SLOW)
    async with httpx.AsyncClient(base_url=b.url, timeout=60) as http:
        got = await _leased(http, "nacked", 2, 2)  # the whole partition leased
        waiting = await _park(http, b, "nacked")
        first = got["messages"][0]
        r = await http.post("/api/v1/ack", json={"transactionId": first["transactionId"],
                                                  "partitionId": first["partitionId"],
                                                  "leaseId": first["leaseId"], "status": "failed",
                                                  "error": "boom"})  # fmt: skip
        assert r.status_code == 200 and r.json()[0]["leaseReleased"]
        answer = await waiting
    assert answer.status_code == 200
    ms = answer.json()["messages"]
    assert [m["data"] for m in ms] == [0, 1] and ms[0]["deliveryAttempt"] == 2


async def test_a_transaction_s_ack_wakes_the_parked_pop(start_broker: Any) -> None:
    """The ack inside POST /transaction (beside a push to another queue) wakes the pop parked on the
    acked queue: no wake is lost because the ack rode in a transaction."""
    b: Broker = await start_broker(**SLOW)
    async with httpx.AsyncClient(base_url=b.url, timeout=60) as http:
        got = await _leased(http, "txq", 3, 1)
        waiting = await _park(http, b, "txq")
        m = got["messages"][0]
        body = {"operations": [
            {"type": "ack", "transactionId": m["transactionId"], "partitionId": m["partitionId"],
             "leaseId": m["leaseId"], "status": "completed"},
            {"type": "push", "items": [{"queue": "elsewhere", "payload": "next step"}]},
        ]}  # fmt: skip
        r = await http.post("/api/v1/transaction", json=body)
        assert r.status_code == 200 and r.json()["success"], r.text
        assert "wake" not in r.json()  # the queues to wake stay in the broker
        answer = await waiting
    assert answer.status_code == 200
    assert [x["data"] for x in answer.json()["messages"]] == [1, 2]


async def test_a_rolled_back_transaction_wakes_nobody(start_broker: Any) -> None:
    """A transaction whose ack is refused commits nothing: the parked pop is not woken (it runs out
    its own short timeout), and the lease is still held."""
    b: Broker = await start_broker(**SLOW)
    async with httpx.AsyncClient(base_url=b.url, timeout=60) as http:
        got = await _leased(http, "txno", 2, 2)
        w = _waiters(b)
        task = asyncio.create_task(http.get("/api/v1/pop/queue/txno", params={"wait": "true", "timeout": 1500}))
        await eventually(lambda: w.parked == 1, "the pop to park")
        skipped = w.skipped
        m = got["messages"][0]
        body = {"operations": [{"type": "ack", "transactionId": m["transactionId"], "partitionId": m["partitionId"],
                                "leaseId": str(uuid.uuid4()), "status": "completed"}]}  # fmt: skip
        r = await http.post("/api/v1/transaction", json=body)
        assert r.status_code == 200 and r.json()["success"] is False and r.json()["reason"] == "rejected_ack"
        answer = await task
    assert answer.status_code == 204
    assert w.skipped == skipped  # never woken to look again


async def test_the_ack_s_queues_to_wake(db: Database, broker: Broker, http: httpx.AsyncClient) -> None:
    """The engine's ``AckResults.wake``, through ack_v3's fast path (the book's hint), its look-up path
    (no hint) and ack_v1's rows path (more kinds than ack_v3 packs: forced here by a request key):
    the queue when a lease was released with messages left, or a nack let them go; nothing for a part
    of a lease or a lease released on an empty partition."""

    def items(got: dict[str, Any], status: str = "completed", k: int | None = None, j: int = 0) -> list[AckItem]:
        return [AckItem(m["transactionId"], m["partitionId"], status, None, None, m["leaseId"])
                for m in got["messages"][j:k]]  # fmt: skip

    book = book_of(broker.app.state.queen.db)  # the broker's book: its pops are remembered there
    for mode in ("hinted", "looked up"):
        q = f"w-{mode.replace(' ', '')}"
        got = await _leased(http, q, 4, 3)
        if mode == "looked up":
            book.forget(uuid.UUID(got["messages"][0]["leaseId"]))
        hits = book.hits
        (part,) = await ack_many(broker.app.state.queen.db, "default", [items(got, k=1)])
        assert list(part.wake) == [] and part[0]["success"] and not part[0]["leaseReleased"]
        (rest,) = await ack_many(broker.app.state.queen.db, "default", [items(got, j=1)])
        assert list(rest.wake) == [q] and rest[-1]["leaseReleased"], (mode, list(rest))
        assert (book.hits > hits) == (mode == "hinted")
        # the last message leased and acked: released on an empty partition, nothing to wake
        last = (await http.get(f"/api/v1/pop/queue/{q}")).json()
        (done,) = await ack_many(broker.app.state.queen.db, "default", [items(last)])
        assert list(done.wake) == [] and done[0]["leaseReleased"]
    got = await _leased(http, "w-nack", 2, 2)
    (nack,) = await ack_many(db, "default", [items(got, "retry", k=1)])
    assert list(nack.wake) == ["w-nack"] and nack[0]["leaseReleased"]
    # the rows path (ack_v2 under a request key) asks queen._ack_wakes after the call
    o = once("k-2", "ack/batch", b"{}", 60)
    assert o is not None
    got = await _leased(http, "w-keyed", 3, 2)
    (keyed,) = await ack_many(db, "default", [items(got)], o)
    assert list(keyed.wake) == ["w-keyed"] and keyed[-1]["leaseReleased"] and not o.replayed
    (again,) = await ack_many(db, "default", [items(got)], once("k-2", "ack/batch", b"{}", 60))
    assert list(again.wake) == []  # a replay changed nothing: no wake


async def test_a_lease_given_back_on_disconnect_wakes_the_parked_pops(broker: Broker, http: httpx.AsyncClient) -> None:
    """``pop.release`` (a claim whose client went away) wakes the pops parked on the claimed queue."""
    await http.post("/api/v1/configure", json={"queue": "gone"})
    await push(http, "gone", [{"payload": 1}])
    st = broker.app.state.queen
    req = pop_engine.PopRequest("gone", None, None, None, None, 1, 1, False, 0, False, None, None, False)
    answer, got = await pop_engine._claim(st.db, "default", req)
    assert answer is not None and got is not None and got.queues == frozenset({"gone"})
    w: Waiters = st.waiters
    ev = w.subscribe("default", "gone")
    anyq = w.subscribe("default", pop_engine.ANY_QUEUE)
    try:
        assert await pop_engine.release(st.db, "default", req, got, w) == 1
        assert ev.is_set() and anyq.is_set()
        ev.clear()
        assert await pop_engine.release(st.db, "default", req, got, w) == 0  # not held any more: no wake
        assert not ev.is_set()
    finally:
        w.release("default", "gone", ev)
        w.release("default", pop_engine.ANY_QUEUE, anyq)


async def test_an_ack_on_replica_a_wakes_a_pop_parked_on_b(db_url: str, tmp_path: Path) -> None:
    """Over the mesh: the ack served by A wakes the pop parked on B (whose re-check is a minute away)."""
    pa, pb = free_port(), free_port()
    peers = f"127.0.0.1:{pa},127.0.0.1:{pb}"
    a = Replica(db_url, tmp_path, "a", mesh_port=pa, mesh_peers=peers, mesh_secret="k", jobs_enabled=0)
    b = Replica(db_url, tmp_path, "b", mesh_port=pb, mesh_peers=peers, mesh_secret="k", jobs_enabled=0,
                pop_poll_interval_ms=60_000, pop_poll_max_ms=600_000)  # fmt: skip
    await asyncio.gather(a.start(), b.start())
    try:
        async with httpx.AsyncClient(timeout=60) as http:

            async def meshed() -> bool:
                text = (await http.get(f"{a.url}/metrics")).text + (await http.get(f"{b.url}/metrics")).text
                return text.count("queen_mesh_peers_connected 1.0") == 2

            await until(meshed, "the replicas to connect")
            r = await http.post(f"{a.url}/api/v1/configure", json={"queue": "meshack", "options": {"leaseTime": 300}})
            assert r.status_code == 200
            r = await http.post(f"{a.url}/api/v1/push",
                                json={"items": [{"queue": "meshack", "payload": i} for i in range(3)]})  # fmt: skip
            assert r.status_code == 201
            got = (await http.get(f"{a.url}/api/v1/pop/queue/meshack", params={"batch": 1})).json()
            waiting = asyncio.create_task(http.get(f"{b.url}/api/v1/pop/queue/meshack", params={**LONG, "batch": 5}))

            async def parked() -> bool:
                return await b.parked() == 1

            await until(parked, "the pop to park on B")
            r = await http.post(f"{a.url}/api/v1/ack/batch", json={"acknowledgments": _acks(got)})
            assert r.status_code == 200 and r.json()[0]["leaseReleased"]
            answer = await waiting
        assert answer.status_code == 200
        assert [m["data"] for m in answer.json()["messages"]] == [1, 2]
    finally:
        a.stop()
        b.stop()


async def test_a_fused_ack_s_wake_survives_its_first_member_going_away(broker: Broker, http: httpx.AsyncClient) -> None:
    """Fused acks share one call and its queues to wake; each route wakes from its own results. When the
    first member's client went away (its route never gets there), the others' results still carry the
    wake: a lease released with messages left must not wait for the parked pops' re-check."""

    def items(got: dict[str, Any], k: int | None = None, j: int = 0) -> list[AckItem]:
        return [AckItem(m["transactionId"], m["partitionId"], "completed", None, None, m["leaseId"])
                for m in got["messages"][j:k]]  # fmt: skip

    first = await _leased(http, "fw-first", 3, 2)
    second = await _leased(http, "fw-second", 3, 2)
    fuser = Fuser(broker.app.state.queen.db, FuseConfig(hold_us=60_000_000, inflight=0, max_items=3))
    lane = fuser.ack_lane("default")
    gone = asyncio.create_task(fuser.ack("default", items(first, k=1)))  # part of its lease: no wake
    await eventually(lambda: lane.queued == 1, "the first ack to join the batch")
    gone.cancel()
    stays = await fuser.ack("default", items(second))  # fills the batch; releases with 1 message left
    assert lane.stats.calls == 1 and stays[-1]["leaseReleased"]
    assert list(stays.wake) == ["fw-second"]
    await fuser.close()


async def test_a_failed_wake_look_up_does_not_turn_a_committed_ack_into_an_error(
    db: Database, http: httpx.AsyncClient, conn: Any
) -> None:
    """The rows path (queen.ack_v2 under a request key, or ack_v1) commits, then asks queen._ack_wakes
    in a second call. A wake is a hint: when that look-up fails, the committed ack still gets its
    verdicts (an error would tell the client it may not have acked, and a retry under a new key or
    none would find its acks already committed)."""
    got = await _leased(http, "w-lookup", 3, 2)
    items = [AckItem(m["transactionId"], m["partitionId"], "completed", None, None, m["leaseId"])
             for m in got["messages"]]  # fmt: skip
    await conn.execute("ALTER FUNCTION queen._ack_wakes(text, bigint[], text[], timestamptz) RENAME TO _ack_wakes_gone")
    o = once("k-lookup", "ack/batch", b"{}", 60)
    assert o is not None
    (res,) = await ack_many(db, "default", [items], o)
    assert [r["success"] for r in res] == [True, True] and res[-1]["leaseReleased"]
    assert list(res.wake) == []
    cursor = await conn.fetchval(
        "SELECT lc.cursor_offset FROM queen.log_consumers lc JOIN queen.queues q ON q.id = lc.queue_id"
        " WHERE q.name = 'w-lookup'"
    )
    assert cursor == 2  # committed
