"""queen.ack_v3's range ack: a cursor row's batch is resolved in one statement, and a plain batch (every
item `completed`, at or above the cursor, inside the live lease it names or naming none) commits through
its highest offset without being judged item by item. Anything else is judged item by item.

The proof that both ways give the same verdicts: docs/wire.md#ack-offset-commit rule 4 says an unresolvable item changes
nothing and the rest of the call is judged as if it were not there, and one unresolvable item always
sends the whole row down the item-by-item path. So every batch below is settled twice (each time in a
transaction that is rolled back): alone, and with an unresolvable item added; the verdicts of the real
items and the cursor row the call leaves must be the same. Concrete expectations on top make sure the
two are not equally wrong. Real PostgreSQL, real HTTP for the set-up, the official client end to end."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from queen import Queen

from queen_pg.engine.ack_pack import Packed
from tests.conftest import Broker
from tests.helpers import pop, push, rolled_back

ACK3 = "SELECT * FROM queen.ack_v3('default', $1, $2, $3, $4, $5, $6, $7, $8)"  # items packed (ack_pack.Packed)
ACK1 = "SELECT * FROM queen.ack_v1('default', $1, $2, $3, $4, $5, $6, $7, $8)"  # parallel arrays (Packed.arrays)
ROW = (
    "SELECT cursor_offset, lease_id, lease_end, released_lease_id, attempts, fail_offset, failures, acked_total"
    " FROM queen.log_consumers WHERE partition_id = $1 AND consumer_group = 'g'"
)
Item = tuple[str, uuid.UUID | None, str]  # (transactionId, lease, status)


def verdicts(row: asyncpg.Record, n: int) -> list[dict[str, Any]]:
    why = dict(zip(row["o_refused"], row["o_errors"], strict=True))
    return [
        {
            "success": i not in why,
            "error": why.get(i),
            "released": i in row["o_released"],
            "dlq": i in row["o_dlq"],
            "noop": i in row["o_noop"],
        }
        for i in range(1, n + 1)
    ]


def packed(pid: int, items: list[Item]) -> Packed:
    """The items as one ack call's arguments (group "g", error text "boom")."""
    pack = Packed()
    for t, lease, status in items:
        pack.add(pid, t, lease, "g", status, "boom")
    return pack


def row_verdicts(rows: list[asyncpg.Record]) -> list[dict[str, Any]]:
    """ack_v1's row per item in the shape of :func:`verdicts`."""
    keys = {"success": "success", "error": "error", "released": "lease_released", "dlq": "dlq", "noop": "noop"}
    return [{k: r[c] for k, c in keys.items()} for r in rows]


async def settle(
    conn: asyncpg.Connection, pid: int, items: list[Item], now: datetime | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
    """ack_v3 on the items, rolled back: (verdicts, the cursor row after, dead letters written)."""
    async with rolled_back(conn):
        row = await conn.fetchrow(ACK3, *packed(pid, items).args(), now)
        after = dict(await conn.fetchrow(ROW, pid))
        dead = await conn.fetchval("SELECT count(*) FROM queen.log_dlq")
    return verdicts(row, len(items)), after, dead


async def both_ways(
    conn: asyncpg.Connection, pid: int, items: list[Item], now: datetime | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The batch alone and with an unresolvable item in the middle: same verdicts, same cursor row."""
    alone, row_alone, dead_alone = await settle(conn, pid, items, now)
    half = len(items) // 2
    lease = items[0][1] if items else None
    mixed = [*items[:half], ("never-pushed", lease, "completed"), *items[half:]]
    judged, row_judged, dead_judged = await settle(conn, pid, mixed, now)
    odd = judged.pop(half)
    assert odd["success"] is False and "unresolvable" in (odd["error"] or "") and "never-pushed" in odd["error"]
    # leaseReleased is reported on the row's last item: the added item may be that one only when it
    # is last, which it never is here (it goes in the middle)
    assert judged == alone
    assert row_judged == row_alone
    assert dead_judged == dead_alone
    return alone, row_alone


@pytest.fixture
async def leased(http: httpx.AsyncClient, conn: asyncpg.Connection) -> tuple[int, uuid.UUID, list[str]]:
    """200 messages t0..t199 in one partition; group g committed through 9 and leasing 10..109."""
    await http.post("/api/v1/configure", json={"queue": "q", "options": {"retryLimit": 1}})
    for b in range(2):
        res = await push(http, "q", [{"payload": {"i": i}, "transactionId": f"t{b * 100 + i}"} for i in range(100)])
    pid = int(res[0]["partitionId"])
    first = await pop(http, "q", consumerGroup="g", batch=10)
    r = await http.post(
        "/api/v1/ack",
        json={"transactionId": "t9", "partitionId": str(pid), "leaseId": first["leaseId"], "consumerGroup": "g"},
    )
    assert r.json()[0]["success"] is True
    got = await pop(http, "q", consumerGroup="g", batch=100)
    assert [m["offset"] for m in got["messages"]] == list(range(10, 110))
    return pid, uuid.UUID(got["leaseId"]), [m["transactionId"] for m in got["messages"]]


async def test_a_plain_batch_commits_through_its_highest_offset(
    conn: asyncpg.Connection, leased: tuple[int, uuid.UUID, list[str]]
) -> None:
    pid, lease, txns = leased
    every = [(t, lease, "completed") for t in txns]
    out, row = await both_ways(conn, pid, every)
    assert all(v["success"] and not v["noop"] and not v["dlq"] for v in out)
    assert [v["released"] for v in out] == [False] * 99 + [True]  # on the row's last item
    assert row["cursor_offset"] == 110 and row["lease_id"] is None and row["released_lease_id"] == lease
    assert row["acked_total"] == 110
    # in reverse, and only every third one (silent gaps are successes): the same commit
    out, row = await both_ways(conn, pid, every[::-1])
    assert row["cursor_offset"] == 110 and out[-1]["released"] and all(v["success"] for v in out)
    out, row = await both_ways(conn, pid, every[:60:3])
    assert row["cursor_offset"] == 68 and row["lease_id"] == lease  # through t67 (offset 67), still leased
    assert all(v["success"] and not v["noop"] and not v["released"] for v in out)
    # without a lease id the lease check is skipped; the same item twice is one commit
    out, row = await both_ways(conn, pid, [(t, None, "completed") for t in txns[:5]] * 2)
    assert row["cursor_offset"] == 15 and all(v["success"] and not v["noop"] for v in out)


async def test_batches_that_are_not_plain_are_judged_item_by_item(
    conn: asyncpg.Connection, leased: tuple[int, uuid.UUID, list[str]]
) -> None:
    pid, lease, txns = leased
    every = [(t, lease, "completed") for t in txns]
    # an item beyond the lease (offset 150, t150): refused; the rest commit
    out, row = await both_ways(conn, pid, [*every[:20], ("t150", lease, "completed")])
    assert out[-1]["success"] is False and "not part of this lease" in out[-1]["error"]
    assert row["cursor_offset"] == 30
    # an item below the cursor (t3, offset 3, committed under the first lease): a noop, with or
    # without the live lease's id; a nack of it is refused (already committed)
    for named in (None, lease):
        out, row = await both_ways(conn, pid, [("t3", named, "completed"), *every[:5]])
        assert out[0] == {"success": True, "error": None, "released": False, "dlq": False, "noop": True}
        assert row["cursor_offset"] == 15
    out, _ = await both_ways(conn, pid, [("t3", lease, "failed"), *every[:5]])
    assert out[0]["success"] is False and "committed" in out[0]["error"]
    # somebody else's lease on one item: that item is refused, the others commit
    other = uuid.uuid4()
    out, row = await both_ways(conn, pid, [*every[:10], (txns[10], other, "completed")])
    assert out[-1]["success"] is False and "not held" in out[-1]["error"] and row["cursor_offset"] == 20
    # a nack in the middle clamps: the cursor stops at it, completed items above it are noops
    out, row = await both_ways(conn, pid, [*every[:30], (txns[12], lease, "failed"), *every[30:40]])
    assert row["cursor_offset"] == 22 and row["lease_id"] is None and row["failures"] == 1
    assert out[30]["success"] and all(v["noop"] for v in out[31:]) and out[-1]["released"]
    # a 'dlq' item dead-letters at once and commits through it
    out, row = await both_ways(conn, pid, [*every[:3], (txns[5], lease, "dlq")])
    assert out[-1]["dlq"] is True and row["cursor_offset"] == 16
    # the lease ran out: every item is refused, nothing moves
    later = datetime.now(UTC) + timedelta(hours=2)
    out, row = await both_ways(conn, pid, every[:10], later)
    assert all(v["success"] is False and "expired" in v["error"] for v in out) and row["cursor_offset"] == 10


async def test_passed_over_offsets_are_never_resolved_by_a_range_ack(
    conn: asyncpg.Connection, leased: tuple[int, uuid.UUID, list[str]]
) -> None:
    """A copy the group passes over (log_passes) is not its message: an item naming only that copy is
    unresolvable, in a plain batch as item by item."""
    pid, lease, txns = leased
    await conn.execute(
        "INSERT INTO queen.log_passes (partition_id, consumer_group, msg_offset) VALUES ($1, 'g', 50)", pid
    )
    every = [(t, lease, "completed") for t in txns[:60]]
    out, row = await both_ways(conn, pid, every)
    assert out[40]["success"] is False and "unresolvable" in out[40]["error"]  # t50 at offset 50
    assert all(v["success"] for i, v in enumerate(out) if i != 40)
    assert row["cursor_offset"] == 70


async def test_the_official_client_s_batch_ack_commits_every_message(broker: Broker, conn: asyncpg.Connection) -> None:
    """End to end: the 2.6 client pops 100 (JSON and framed) and acks them as a batch; every item
    answers success/noop false, the lease is released once, and the group's cursor is at 100."""
    for framed in (False, True):
        queue = f"rng{int(framed)}"
        async with Queen(broker.url, framed_pop=framed) as client:
            await client.queue(queue).push([{"data": {"i": i}, "transactionId": f"x{i}"} for i in range(100)])
            msgs = await client.queue(queue).group("g").batch(100).wait(False).pop()
            assert len(msgs) == 100
            res = await client.ack(msgs, True, {"group": "g"})
            assert res["success"] is True
            results = res["results"]
            assert [r["index"] for r in results] == list(range(100))
            assert all(r["success"] and not r["noop"] and not r["dlq"] and r["error"] is None for r in results)
            assert [r["leaseReleased"] for r in results] == [False] * 99 + [True]
            cur = await conn.fetchval(
                "SELECT c.cursor_offset FROM queen.log_consumers c JOIN queen.queues q ON q.id = c.queue_id"
                " WHERE q.name = $1 AND c.consumer_group = 'g'",
                queue,
            )
            assert cur == 100
            # acking them again: all noops (below the cursor, the lease they name was the last one)
            again = await client.ack(msgs, True, {"group": "g"})
            assert all(r["success"] and r["noop"] for r in again["results"])


async def test_packed_items_keep_every_field(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    """ack_v3 takes its items packed (transactionIds as concatenated UTF-8, the distinct partition/
    group/lease/status kinds): several kinds in one call, multi-byte transactionIds, an error text
    and an unresolvable item all reach the right item."""
    await http.post("/api/v1/configure", json={"queue": "u", "options": {"retryLimit": 0}})
    txns = {"p1": ["é-1", "日本-2", "x"], "p2": ["ü" * 40, "🙂-5"]}
    pids = {}
    for part, names in txns.items():
        res = await push(http, "u", [{"payload": i, "transactionId": t} for i, t in enumerate(names)], part)
        pids[part] = int(res[0]["partitionId"])
    leases = {part: uuid.UUID((await pop(http, "u", partition=part, consumerGroup="g", batch=5))["leaseId"])
              for part in txns}  # fmt: skip
    pack = Packed()
    pack.add(pids["p1"], "日本-2", leases["p1"], "g", "completed", None)
    pack.add(pids["p2"], "ü" * 40, leases["p2"], "g", "failed", "bö: 失敗")
    pack.add(pids["p1"], "日本-nope", leases["p1"], "g", "completed", None)
    pack.add(pids["p2"], "🙂-5", leases["p2"], "g", "completed", None)
    row = await conn.fetchrow(ACK3, *pack.args(), None)
    assert list(row["o_refused"]) == [3] and "日本-nope" in row["o_errors"][0] and "unresolvable" in row["o_errors"][0]
    assert list(row["o_dlq"]) == [2]  # retryLimit 0: the failed item goes to the DLQ at once
    assert list(row["o_noop"]) == []  # 🙂-5 is above the dead letter, committed with it (no nack left)
    dead = await conn.fetchrow("SELECT transaction_id, error, msg_offset FROM queen.log_dlq")
    assert (dead["transaction_id"], dead["error"], dead["msg_offset"]) == ("ü" * 40, "bö: 失敗", 0)
    cursors = dict(
        await conn.fetch("SELECT partition_id, cursor_offset FROM queen.log_consumers WHERE consumer_group = 'g'")
    )
    assert cursors == {pids["p1"]: 2, pids["p2"]: 2}
    # the same items as parallel arrays (ack_v1, under a request key) give the same verdicts
    assert len(pack.arrays()[0]) == 4 and pack.arrays()[2] == ["日本-2", "ü" * 40, "日本-nope", "🙂-5"]


async def test_a_malformed_packed_body_is_refused_whole(conn: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.RaiseError, match="26-byte"):
        await conn.fetch(ACK3, b"\x00" * 25, [1], ["g"], [None], ["completed"], b"", None, None)
    row = await conn.fetchrow(ACK3, b"", [], [], [], [], b"", None, None)  # nothing to settle
    assert [list(v) for v in row.values()] == [[], [], [], [], [], []]  # (o_wake last)


async def test_an_unknown_lease_state_is_never_taken_for_a_plain_batch(
    conn: asyncpg.Connection, leased: tuple[int, uuid.UUID, list[str]]
) -> None:
    """A cursor row whose lease has no expiry (NULL: never written so, but a NULL must not read as "live")
    with a batch that mixes items naming that lease and items naming none: the ones naming it are judged
    as the item path judges them (refused), never accepted by the one-statement check."""
    pid, lease, txns = leased
    await conn.execute(
        "UPDATE queen.log_consumers SET lease_expires_at = NULL WHERE partition_id = $1 AND consumer_group = 'g'",
        pid,
    )
    out, row = await both_ways(conn, pid, [(txns[0], None, "completed"), (txns[1], lease, "completed")])
    assert out[0]["success"] is True and out[1]["success"] is False and "lease" in out[1]["error"]
    assert row["cursor_offset"] == 11


async def test_more_distinct_item_kinds_than_the_packed_format_holds_are_still_settled(
    start_broker: Any, conn: asyncpg.Connection, leased: tuple[int, uuid.UUID, list[str]]
) -> None:
    """A packed item's kind is a u16: a batch naming more than 65535 distinct (partition, group, lease,
    status) kinds (here: partitions nobody has) must still be answered item by item, never a 500. Such a
    batch is past the default QUEEN_MAX_ITEMS: a broker that allows it answers it."""
    pid, lease, txns = leased
    acks = [{"transactionId": txns[0], "partitionId": str(pid), "leaseId": str(lease), "status": "completed"}]
    acks += [{"transactionId": f"t{i}", "partitionId": str(10**6 + i), "status": "completed"} for i in range(70_000)]
    wide = await start_broker(max_items=100_000)
    async with httpx.AsyncClient(base_url=wide.url, timeout=120) as client:
        r = await client.post("/api/v1/ack/batch", json={"consumerGroup": "g", "acknowledgments": acks})
    assert r.status_code == 200, r.text
    out = r.json()
    assert len(out) == 70_001 and out[0]["success"] is True and out[0]["error"] is None
    assert not any(v["success"] for v in out[1:])
    assert out[-1]["error"] == f"consumer group g has no cursor on partition {10**6 + 69_999}"
    cursor = await conn.fetchval(
        "SELECT cursor_offset FROM queen.log_consumers WHERE partition_id = $1 AND consumer_group = 'g'", pid
    )
    assert cursor == 11


async def test_an_ack_in_queue_mode_without_its_cursor_names_queue_mode(
    http: httpx.AsyncClient, conn: asyncpg.Connection, leased: tuple[int, uuid.UUID, list[str]]
) -> None:
    """Queue mode (no consumerGroup) has never popped this partition (only group g has): the verdict
    names queue mode, not the stored group name, and nothing is written."""
    pid, _, txns = leased
    ack = {"transactionId": txns[0], "partitionId": str(pid), "status": "completed"}
    r = await http.post("/api/v1/ack/batch", json={"acknowledgments": [ack]})
    assert r.status_code == 200, r.text
    (out,) = r.json()
    assert out["success"] is False
    assert out["error"] == f"partition {pid} has no queue-mode cursor (never popped, or deleted)"
    assert await conn.fetchval("SELECT count(*) FROM queen.log_consumers WHERE partition_id = $1", pid) == 1


async def test_a_large_batch_judged_item_by_item_gets_every_verdict(
    conn: asyncpg.Connection, leased: tuple[int, uuid.UUID, list[str]]
) -> None:
    """20,000 items for one cursor row, of every kind the item path judges (unresolvable, below the
    cursor, a nack of a committed offset, another lease, beyond the lease, `dlq` twice on one offset,
    completed), interleaved: every verdict is the one its kind gets, through ack_v3 (packed) and ack_v1
    (parallel arrays, the keyed and transaction paths). The item path reads each item's fields by its
    index: once it walked the text arrays for every item (quadratic: 20,000 unresolvable items took
    seconds of PostgreSQL time); a wrong index would show here as a wrong transactionId in an error."""
    pid, lease, _ = leased  # cursor at 10, `lease` live on 10..109, t0..t199 pushed
    other = uuid.uuid4()
    items: list[Item] = []
    want: list[dict[str, Any]] = []
    dead: set[str] = set()
    for i in range(20_000):
        kind, j = i % 8, i % 100
        ok = {"success": True, "error": None, "released": False, "dlq": False, "noop": False}
        if kind == 0:
            items.append((f"nope-{i}", lease, "completed"))
            err = f"transactionId nope-{i} is unresolvable in partition {pid}"
            want.append({**ok, "success": False, "error": err})
        elif kind == 1:
            items.append((f"t{j % 10}", None, "completed"))
            want.append({**ok, "noop": True})
        elif kind == 2:
            items.append((f"t{j % 10}", lease, "failed"))
            err = f"offset {j % 10} is already committed (the cursor is at 10): a nack cannot take it back"
            want.append({**ok, "success": False, "error": err})
        elif kind == 3:
            items.append((f"t{10 + j}", other, "completed"))
            want.append({**ok, "success": False, "error": "lease is not held (expired or taken by another consumer)"})
        elif kind == 4:
            items.append((f"t{110 + j % 90}", lease, "completed"))
            want.append({**ok, "success": False, "error": "message is not part of this lease"})
        elif kind == 5:  # dead-lettered once per offset: by the first item naming it
            t = f"t{10 + (i // 8) % 50}"
            items.append((t, lease, "dlq"))
            want.append({**ok, "dlq": t not in dead})
            dead.add(t)
        else:
            items.append((f"t{10 + j}", lease, "completed"))
            want.append(ok)
    want[-1]["released"] = True  # the cursor reached the lease's end: on the row's last item

    got, row, written = await settle(conn, pid, items)
    for v, w in zip(got, want, strict=True):
        if w["error"] and "unresolvable" in w["error"]:
            assert v["error"] is not None and v["error"].startswith(w["error"])
            v = {**v, "error": w["error"]}
        assert v == w
    assert row["cursor_offset"] == 110 and row["lease_id"] is None and row["released_lease_id"] == lease
    assert written == len(dead) == 50

    async with rolled_back(conn):
        rows = await conn.fetch(ACK1, *packed(pid, items).arrays(), None)
        dlq = await conn.fetch("SELECT transaction_id, msg_offset FROM queen.log_dlq ORDER BY msg_offset")
    assert [r["idx"] for r in rows] == list(range(1, 20_001))
    assert row_verdicts(rows) == got
    assert [(r["transaction_id"], r["msg_offset"]) for r in dlq] == [(f"t{o}", o) for o in range(10, 60)]


async def test_one_kind_batches_resolved_in_one_scan_answer_as_the_arrays_path(
    conn: asyncpg.Connection, leased: tuple[int, uuid.UUID, list[str]]
) -> None:
    """A batch of one kind (one partition, group, lease, status `completed`) is resolved by one index
    scan over its hashes (queen._ack_settle p_uniform); ack_v1 (parallel arrays) never takes that way.
    Both must leave the same verdicts and cursor row, the scan's refusals (an item below the cursor,
    beyond the lease, repeated, expired) included."""
    pid, lease, txns = leased
    every = [(t, lease, "completed") for t in txns]
    later = datetime.now(UTC) + timedelta(hours=2)
    batches: list[tuple[list[Item], datetime | None]] = [
        (every, None),
        (every[5:40:2], None),
        ([*every[:10], every[3], every[3]], None),  # a transactionId named three times
        ([("t3", lease, "completed"), *every[:5]], None),  # below the cursor
        ([*every[:20], ("t150", lease, "completed")], None),  # beyond the lease
        ([*every[:20], ("t150", lease, "completed")][::-1], None),
        ([(t, None, "completed") for t in [*txns[:10], "t150"]], None),  # no lease named: t150 counts
        (every[:10], later),  # the lease ran out
    ]
    for items, now in batches:
        scanned = await settle(conn, pid, items, now)
        async with rolled_back(conn):
            rows = await conn.fetch(ACK1, *packed(pid, items).arrays(), now)
            after = dict(await conn.fetchrow(ROW, pid))
        assert scanned[0] == row_verdicts(rows), items
        assert scanned[1] == after, items
    # the concrete answers, so the two are not equally wrong
    out, row, _ = await settle(conn, pid, [(t, None, "completed") for t in [*txns[:10], "t150"]])
    assert all(v["success"] for v in out) and row["cursor_offset"] == 151 and row["lease_id"] is None
    out, row, _ = await settle(conn, pid, [*every[:10], every[3], every[3]])
    assert all(v["success"] and not v["noop"] for v in out) and row["cursor_offset"] == 20
