"""The lease book (queen_pg/engine/leases.py) and queen.ack_v3's p_hint: an ack of what this process
leased is settled without looking its hashes up, and gives exactly the verdicts and cursor row the
look-up gives. Every hint PostgreSQL must not trust (stale range, cursor moved past an item, an item
beyond the lease, passed-over offsets, a lease not live, segments gone) falls back to the look-up.
Real PostgreSQL, real HTTP."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from queen_pg.api.shared.items import AckItem
from queen_pg.engine import calls, leases
from queen_pg.engine.ack import ack_many
from queen_pg.engine.ack_pack import Packed
from queen_pg.engine.leases import LeaseBook
from tests.conftest import Broker
from tests.helpers import push, rolled_back
from tests.test_ack_range import ROW, verdicts

Item = tuple[str, str]  # (transactionId, status)


async def settle(
    conn: asyncpg.Connection, pid: int, lease: uuid.UUID, items: list[Item], hint: list[int] | None,
    now: datetime | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """ack_v3 with the hint, rolled back: (verdicts, cursor row after)."""
    async with rolled_back(conn):
        pack = Packed()
        for t, status in items:
            pack.add(pid, t, lease, "g", status, None)
        args = list(pack.args())
        row = await conn.fetchrow(calls.ACK.replace("NULL, $9", "$9, $10"), "default", *args, now, hint)
        after = dict(await conn.fetchrow(ROW, pid))
    return verdicts(row, len(items)), after


async def same_both_ways(
    conn: asyncpg.Connection, pid: int, lease: uuid.UUID, items: list[Item], hint: list[int] | None,
    now: datetime | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    hinted = await settle(conn, pid, lease, items, hint, now)
    looked_up = await settle(conn, pid, lease, items, None, now)
    assert hinted == looked_up, items
    return hinted


@pytest.fixture
async def leased(http: httpx.AsyncClient, conn: asyncpg.Connection) -> tuple[int, uuid.UUID, list[Any], list[str]]:
    """t0..t199 in one partition; group g committed through 9 (a first pop and ack), then leasing
    10..109 through pop_v1 directly: (pid, lease, pop rows, transactionIds in offset order)."""
    for b in range(2):
        res = await push(http, "q", [{"payload": {"i": i}, "transactionId": f"t{b * 100 + i}"} for i in range(100)])
    pid = int(res[0]["partitionId"])
    first = uuid.uuid4()
    await conn.fetch(calls.POP, "default", "q", None, None, None, "g", 10, 1, first, False, "all", None, None)
    pack = Packed()
    pack.add(pid, "t9", first, "g", "completed", None)
    await conn.fetch(calls.ACK, "default", *pack.args(), None)
    lease = uuid.uuid4()
    rows = await conn.fetch(calls.POP, "default", "q", None, None, None, "g", 100, 1, lease, False, "all", None, None)
    assert (rows[0]["lease_start"], rows[0]["lease_end"]) == (10, 110)
    return pid, lease, rows, [f"t{i}" for i in range(10, 110)]


async def test_the_book_resolves_what_it_leased_and_nothing_else(
    leased: tuple[int, uuid.UUID, list[Any], list[str]],
) -> None:
    pid, lease, rows, txns = leased
    book = LeaseBook()
    book.remember(lease, rows)
    assert book.hint(lease, pid, txns) == [10, 10, 109]
    assert book.hint(lease, pid, txns[20:30][::-1]) == [10, 30, 39]
    assert book.hint(lease, pid, ["t5"]) is None  # below the lease: not among its frames
    assert book.hint(lease, pid, ["t150"]) is None  # above it
    assert book.hint(lease, pid + 1, txns) is None and book.hint(uuid.uuid4(), pid, txns) is None
    assert book.hint(lease, pid, []) is None
    assert (book.hits, book.misses) == (2, 5)
    # passed-over offsets are not the group's messages: never resolved from the book
    passed = [dict(r) | {"acked": [50]} for r in rows]
    book.remember(lease, passed)
    assert book.hint(lease, pid, ["t50"]) is None and book.hint(lease, pid, ["t51"]) == [10, 51, 51]
    # bounded: the oldest lease goes first
    small = LeaseBook(max_bytes=sum(len(r["payload"]) for r in rows) + 500, max_leases=10)
    other = uuid.uuid4()
    small.remember(lease, rows)
    small.remember(other, rows)
    assert len(small) == 1 and small.hint(lease, pid, txns) is None and small.hint(other, pid, txns) == [10, 10, 109]
    two = LeaseBook()
    two.remember(lease, [*rows, dict(rows[0]) | {"partition_id": pid + 1}])
    two.settled(lease, pid)
    assert len(two) == 1 and two.hint(lease, pid, txns) is None  # the other partition's part stays
    two.settled(lease, pid + 1)
    assert len(two) == 0 and two.bytes == 0
    none = LeaseBook(max_bytes=0)
    none.remember(lease, rows)
    assert len(none) == 0


async def test_a_hinted_ack_gives_the_look_up_s_verdicts(
    conn: asyncpg.Connection, leased: tuple[int, uuid.UUID, list[Any], list[str]]
) -> None:
    pid, lease, rows, txns = leased
    book = LeaseBook()
    book.remember(lease, rows)
    every = [(t, "completed") for t in txns]
    out, row = await same_both_ways(conn, pid, lease, every, book.hint(lease, pid, txns))
    assert all(v["success"] and not v["noop"] for v in out) and out[-1]["released"]
    assert row["cursor_offset"] == 110 and row["lease_id"] is None and row["acked_total"] == 110
    part = txns[5:40:3]
    out, row = await same_both_ways(conn, pid, lease, [(t, "completed") for t in part], book.hint(lease, pid, part))
    assert row["cursor_offset"] == 49 and row["lease_id"] == lease and not any(v["released"] for v in out)


async def test_a_hint_postgresql_cannot_trust_falls_back_to_the_look_up(
    conn: asyncpg.Connection, leased: tuple[int, uuid.UUID, list[Any], list[str]]
) -> None:
    pid, lease, _rows, txns = leased
    every = [(t, "completed") for t in txns[:20]]
    right = [10, 10, 29]
    out, row = await settle(conn, pid, lease, every, right)
    assert row["cursor_offset"] == 30 and all(v["success"] for v in out)
    # lies a hint could tell, each refused: the verdicts are the look-up's, not the hint's
    for wrong in ([10, 10, 150], [10, 5, 29], [11, 11, 29], [10, 10, 110]):
        out, row = await same_both_ways(conn, pid, lease, every, wrong)
        assert row["cursor_offset"] == 30, wrong
    # (that every item is among the offsets the hint spans is the broker's word: the book gives no
    # hint for an item it did not lease, test_the_book_resolves_what_it_leased_and_nothing_else)
    # the cursor moved past the hint's start (a first ack through 14): an item below it is a noop
    await conn.execute("UPDATE queen.log_consumers SET cursor_offset = 15 WHERE partition_id = $1", pid)
    out, row = await same_both_ways(conn, pid, lease, every, right)
    assert [v["noop"] for v in out] == [True] * 5 + [False] * 15 and row["cursor_offset"] == 30
    await conn.execute("UPDATE queen.log_consumers SET cursor_offset = 10 WHERE partition_id = $1", pid)
    # the lease ran out: refused either way
    later = datetime.now(UTC) + timedelta(hours=2)
    out, row = await same_both_ways(conn, pid, lease, every, right, later)
    assert all(v["success"] is False for v in out) and row["cursor_offset"] == 10
    # a passed-over offset in the partition: the hint is not used (t15 stays unresolvable)
    await conn.execute(
        "INSERT INTO queen.log_passes (partition_id, consumer_group, msg_offset) VALUES ($1, 'g', 15)", pid
    )
    out, row = await same_both_ways(conn, pid, lease, every, right)
    assert out[5]["success"] is False and "unresolvable" in out[5]["error"]
    await conn.execute("DELETE FROM queen.log_passes")
    # the segment holding the items is gone (retention): their hashes went with it, the look-up decides
    await conn.execute("DELETE FROM queen.log_segments WHERE partition_id = $1 AND base_offset = 0", pid)
    await conn.execute("DELETE FROM queen.log_txns WHERE partition_id = $1 AND msg_offset < 100", pid)
    out, row = await same_both_ways(conn, pid, lease, every, right)
    assert all(v["success"] is False and "unresolvable" in v["error"] for v in out) and row["cursor_offset"] == 10


async def test_acks_over_http_use_the_book_of_the_broker_that_leased(broker: Broker, http: httpx.AsyncClient) -> None:
    book = leases.book_of(broker.app.state.queen.db)
    await push(http, "hq", [{"payload": {"i": i}, "transactionId": f"h{i}"} for i in range(50)])
    hits = book.hits
    got = (await http.get("/api/v1/pop/queue/hq", params={"batch": 50, "wait": "false"})).json()
    acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"],
             "status": "completed"} for m in got["messages"]]  # fmt: skip
    r = await http.post("/api/v1/ack/batch", json={"acknowledgments": acks})
    assert all(x["success"] and not x["noop"] for x in r.json()) and r.json()[-1]["leaseReleased"]
    assert book.hits == hits + 1
    assert all(lid != uuid.UUID(got["leaseId"]) for lid in book._leases)  # used: forgotten
    assert len(book) == 0 and book.bytes == 0
    assert (await http.get("/api/v1/pop/queue/hq", params={"wait": "false"})).status_code == 204  # all committed
    # framed pops are remembered too
    await push(http, "hq", [{"payload": {"i": i}, "transactionId": f"f{i}"} for i in range(10)])
    r = await http.get("/api/v1/pop/queue/hq", params={"batch": 10, "wait": "false", "frames": "true"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-queen-pop")
    lease = next(iter(reversed(book._leases)))
    pid = next(iter(book._leases[lease][0]))
    assert book.hint(lease, pid, [f"f{i}" for i in range(10)]) is not None


async def test_fused_acks_of_several_leases_use_each_row_s_hint(broker: Broker, http: httpx.AsyncClient) -> None:
    """Requests fused into one ack_v3 call (engine/fusion.py): each cursor row whose items are of one
    kind gets its kind's hint; a row shared by two kinds (two statuses) is looked up."""
    db = broker.app.state.queen.db
    book = leases.book_of(db)
    got = {}
    for part in ("a", "b", "c"):
        await push(http, "fq", [{"partition": part, "payload": {"i": i}, "transactionId": f"{part}{i}"}
                                for i in range(20)])  # fmt: skip
        got[part] = (
            await http.get(f"/api/v1/pop/queue/fq/partition/{part}", params={"batch": 20, "wait": "false"})
        ).json()

    def items(part: str, status: str = "completed", n: int = 20) -> list[AckItem]:
        return [AckItem(m["transactionId"], m["partitionId"], status, None, None, m["leaseId"])
                for m in got[part]["messages"][:n]]  # fmt: skip

    hits = book.hits
    # c: 10 completed and its 11th as retry, two kinds on one row: judged by the look-up (cursor at 10)
    out = await ack_many(db, "default", [items("a"), items("b")[:15], [*items("c", n=10), *items("c", "retry")[10:11]]])
    # the book resolved a, b and c's completed kind; ack_v3 uses a's and b's only (c's row has two kinds)
    assert book.hits == hits + 3
    assert all(r["success"] for req in out for r in req)
    assert out[0][-1]["leaseReleased"] and not out[1][-1]["leaseReleased"] and out[2][-1]["leaseReleased"]
    rows = await db.fetch("SELECT p.name, lc.cursor_offset FROM queen.log_consumers lc "
                          "JOIN queen.log_partitions p ON p.id = lc.partition_id ORDER BY 1")  # fmt: skip
    assert [(r["name"], r["cursor_offset"]) for r in rows] == [("a", 20), ("b", 15), ("c", 10)]


async def test_the_usual_hinted_ack_never_judges_item_by_item(
    conn: asyncpg.Connection, leased: tuple[int, uuid.UUID, list[Any], list[str]]
) -> None:
    """queen.ack_v3's fast path settles a hinted ack of one lease by itself (queen._ack_settle, renamed
    away here, is not called), with the look-up's verdicts and row: a retry budget being spent below the
    new cursor is reset, the attempts of a range delivered again end with it; what it cannot decide (a
    lease run out) still goes to queen._ack_settle."""
    pid, lease, rows, txns = leased
    book = LeaseBook()
    book.remember(lease, rows)
    await conn.execute(
        "UPDATE queen.log_consumers SET fail_offset = 12, failures = 2, attempts = 3, delivered_end = 60"
        " WHERE partition_id = $1", pid
    )  # fmt: skip
    part = txns[:30]
    out, row = await same_both_ways(conn, pid, lease, [(t, "completed") for t in part], book.hint(lease, pid, part))
    assert all(v["success"] and not v["released"] for v in out)
    assert (row["cursor_offset"], row["fail_offset"], row["failures"], row["attempts"]) == (40, None, 0, 3)
    every = [(t, "completed") for t in txns]
    async with rolled_back(conn):
        await conn.execute("ALTER FUNCTION queen._ack_settle RENAME TO _ack_settle_away")
        pack = Packed()
        for t, status in every:
            pack.add(pid, t, lease, "g", status, None)
        res = await conn.fetchrow(calls.ACK.replace("NULL, $9", "$9, $10"), "default", *pack.args(), None,
                                  book.hint(lease, pid, txns))  # fmt: skip
        out = verdicts(res, len(every))
        assert all(v["success"] and not v["noop"] for v in out) and [v["released"] for v in out][-2:] == [False, True]
        row = dict(await conn.fetchrow(ROW, pid))
        assert (row["cursor_offset"], row["lease_id"], row["acked_total"], row["attempts"]) == (110, None, 110, 0)
        assert row["released_lease_id"] == lease
        with pytest.raises(asyncpg.UndefinedFunctionError):  # the lease is gone: only _ack_settle can say so
            await conn.fetchrow(calls.ACK.replace("NULL, $9", "$9, $10"), "default", *pack.args(), None,
                                book.hint(lease, pid, txns))  # fmt: skip


async def test_fused_hinted_acks_of_several_rows_settle_without_the_item_loop(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    """Several leases in one ack_v3 call (fused requests), one kind per cursor row, every kind hinted:
    ack_v3 settles them all itself (queen._ack_settle, renamed away, is not called), with the look-up's
    verdicts and rows: leaseReleased on each released row's last item, a partial ack keeps its lease.
    When one row fails a check (its lease ran out) nothing is written by that path: every row goes to
    queen._ack_settle and the answers are the look-up's."""
    parts = ("a", "b", "c")
    for part in parts:
        await push(http, "mq", [{"partition": part, "payload": {"i": i}, "transactionId": f"{part}{i}"}
                                for i in range(30)])  # fmt: skip
    book = LeaseBook()
    got: dict[str, tuple[int, uuid.UUID]] = {}
    for part in parts:
        lease = uuid.uuid4()
        rows = await conn.fetch(
            calls.POP, "default", "mq", part, None, None, "g", 30, 1, lease, False, "all", None, None
        )
        assert (rows[0]["lease_start"], rows[0]["lease_end"]) == (0, 30)
        book.remember(lease, rows)
        got[part] = (int(rows[0]["partition_id"]), lease)
    # a: every item (released); b: the first 12 (lease kept); c: every item, its items interleaved with a's
    plan = [("a", i) for i in range(15)] + [("c", i) for i in range(30)] + [("a", i) for i in range(15, 30)]
    plan += [("b", i) for i in range(12)]

    def pack_of() -> Packed:
        pack = Packed()
        for part, i in plan:
            pid, lease = got[part]
            pack.add(pid, f"{part}{i}", lease, "g", "completed", None)
        return pack

    pids = [got[p][0] for p in parts]

    async def run(hint: list[int | None] | None, now: datetime | None, away: bool) -> tuple[Any, Any]:
        async with rolled_back(conn):
            if away:
                await conn.execute("ALTER FUNCTION queen._ack_settle RENAME TO _ack_settle_away")
            res = await conn.fetchrow(calls.ACK.replace("NULL, $9", "$9, $10"), "default", *pack_of().args(), now, hint)
            rows = [dict(await conn.fetchrow(ROW, pid)) for pid in pids]
            return verdicts(res, len(plan)), (rows, sorted(res["o_wake"]))

    hint = pack_of().hint(book)
    assert hint is not None and None not in hint and len(hint) == 9
    fast = await run(hint, None, away=True)  # would raise UndefinedFunctionError if it called _ack_settle
    looked_up = await run(None, None, away=False)
    assert fast == looked_up
    out, (rows, _wake) = fast
    assert all(v["success"] and not v["noop"] for v in out)
    assert [i + 1 for i, v in enumerate(out) if v["released"]] == [45, 60]  # c's last item, a's last item
    assert [(r["cursor_offset"], r["lease_id"] is None) for r in rows] == [(30, True), (12, False), (30, True)]
    # b's lease ran out (only b's): the look-up decides every row, as without the hint
    await conn.execute("UPDATE queen.log_consumers SET lease_expires_at = now() - interval '1 second'"
                       " WHERE partition_id = $1", got["b"][0])  # fmt: skip
    with pytest.raises(asyncpg.UndefinedFunctionError):
        await run(hint, None, away=True)
    fallback = await run(hint, None, away=False)
    assert fallback == await run(None, None, away=False)
    out, (rows, _wake) = fallback
    assert all(not v["success"] for v in out[60:]) and all(v["success"] for v in out[:60])
    assert [(r["cursor_offset"], r["lease_id"] is None) for r in rows] == [(30, True), (0, False), (30, True)]
