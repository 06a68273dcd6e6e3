"""queen.push_v3 (compact arguments and answer) against queen.push_v1 (one row per item), real PostgreSQL.

push_v3 takes the hashes and message ids as one bytea each and answers one row: per group its partition
id and first offset, and only the duplicates. The broker derives every item's verdict from it
(``push.placed``). These tests hold that derivation equal to push_v1's rows on the same calls, check
that the stored state is the same, that a wrong byte count is refused before anything is written, and
that the broker's push route no longer needs push_v1 while a previous-release broker's push_v1 calls
interleave with it on one partition (rolling deploy).
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import asyncpg
import httpx
import pytest

from queen_pg.engine import codec
from queen_pg.engine import push as push_engine
from tests.helpers import push

V1 = "SELECT * FROM queen.push_v1('default', $1, $2, $3, $4, $5, $6)"
V3 = "SELECT * FROM queen.push_v3('default', $1, $2, $3, $4, $5, $6)"


def prepared_call(items: list[tuple[str, str, str]], prefix: str) -> push_engine.PreparedPush:
    """(queue, partition, transactionId) items as push_engine.prepare packs them, queues prefixed."""
    msgs = [push_engine.NewMessage(prefix + q, p, f'"{t}"'.encode(), t, None) for q, p, t in items]
    return push_engine.prepare(msgs)


def scripted_calls(seed: int) -> list[list[tuple[str, str, str]]]:
    """Calls over 2 queues x 3 partitions, groups interleaved, transactionIds drawn from a small pool:
    duplicates inside a call, of earlier calls, and across partitions (not duplicates there)."""
    rnd = random.Random(seed)
    calls = []
    for _ in range(8):
        n = rnd.randint(1, 25)
        calls.append(
            [(rnd.choice("qr"), rnd.choice(["a", "b", "Default"]), f"t{rnd.randint(0, 30)}") for _ in range(n)]
        )
    return calls


async def state(conn: asyncpg.Connection, prefix: str) -> list[Any]:
    """What the calls stored under the queues starting with ``prefix`` (names without it)."""
    rows = await conn.fetch(
        """SELECT substr(q.name, 2) AS q, p.name AS p, p.next_offset, p.duplicates_total, p.segments_total,
                  (SELECT array_agg(ARRAY[s.base_offset, s.end_offset, cardinality(coalesce(s.dropped, '{}'))]
                                    ORDER BY s.base_offset)
                     FROM queen.log_segments s WHERE s.partition_id = p.id) AS segs,
                  (SELECT array_agg(t.msg_offset ORDER BY t.msg_offset)
                     FROM queen.log_txns t WHERE t.partition_id = p.id) AS txn_offsets
             FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id
            WHERE q.name LIKE $1 || '%'
            ORDER BY 1, 2""",
        prefix,
    )
    return [tuple(r) for r in rows]


class SameVerdicts:
    """Two pushes of the same items, compared item by item: same status and offset, each queued item
    keeps the id it was given, each duplicate names the same original on both sides."""

    def __init__(self) -> None:
        self.minted_a: dict[uuid.UUID, tuple[int, int]] = {}  # message id -> (call, item) that minted it
        self.minted_b: dict[uuid.UUID, tuple[int, int]] = {}
        self.seen: set[Any] = set()
        self.dups = self.queued_again = 0

    def check(self, c: int, items: list[Any], a_rows: list[Any], b_rows: list[Any], ids_a: list[Any],
              ids_b: list[Any]) -> None:  # fmt: skip
        for i, (a, b) in enumerate(zip(a_rows, b_rows, strict=True)):
            assert (a[0], a[3]) == (b[0], b[3]), (c, i, items[i])  # status, offset
            if a[0] == "queued":
                assert a[1] == ids_a[i] and b[1] == ids_b[i]
                self.minted_a[a[1]] = self.minted_b[b[1]] = (c, i)
                self.queued_again += items[i] in self.seen
                self.seen.add(items[i])
            else:
                self.dups += 1
                assert self.minted_a[a[1]] == self.minted_b[b[1]]  # the same original


# what the two sides stored: hashes, times, segments ({more}: the segments' codec and size, the
# partitions' last write, for two sides that stored the same blobs)
STORED = """SELECT substr(q.name, 2), p.name, t.msg_offset, t.txn_hash, t.created_at, s.created_at, s.dropped{more}
              FROM queen.log_txns t JOIN queen.log_partitions p ON p.id = t.partition_id
              JOIN queen.queues q ON q.id = p.queue_id
              JOIN queen.log_segments s ON s.partition_id = p.id AND t.msg_offset >= s.base_offset
                                       AND t.msg_offset < s.end_offset
             WHERE q.name LIKE $1 || '%' ORDER BY 1, 2, 3"""


async def same_stored(conn: asyncpg.Connection, blobs_too: bool = False) -> None:
    q = STORED.format(more=", s.codec, length(s.payload), p.last_write_at" if blobs_too else "")
    assert [tuple(r) for r in await conn.fetch(q, "1")] == [tuple(r) for r in await conn.fetch(q, "3")]


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_push_v3_answers_and_stores_what_push_v1_does(conn: asyncpg.Connection, seed: int) -> None:
    minted_v1: dict[uuid.UUID, tuple[int, int]] = {}  # message id -> (call, item) that minted it
    minted_v3: dict[uuid.UUID, tuple[int, int]] = {}
    dups = 0
    for c, items in enumerate(scripted_calls(seed)):
        p1 = prepared_call(items, "1")
        rows = await conn.fetch(V1, *p1.args())
        v1 = push_engine.rows_placed(rows)
        p3 = prepared_call(items, "3")
        (row,) = await conn.fetch(V3, *p3.args_v3())
        v3 = push_engine.placed(p3, row)
        assert len(v1) == len(v3) == len(items)
        for i, (a, b) in enumerate(zip(v1, v3, strict=True)):
            assert a[0] == b[0], (c, i, items[i])  # status
            assert a[3] == b[3], (c, i, items[i])  # offset
            if a[0] == "queued":
                assert a[1] == p1.msgids[i] and b[1] == p3.msgids[i]
                minted_v1[a[1]] = minted_v3[b[1]] = (c, i)
            else:
                dups += 1
                assert minted_v1[a[1]] == minted_v3[b[1]]  # the same original
        # the partition ids are the partitions of the right groups (names as push_v1 says them)
        names = dict(await conn.fetch("SELECT id, name FROM queen.log_partitions"))
        assert [names[b[2]] for b in v3] == [p for _, p, _ in items]
    assert dups > 5  # the script did exercise duplicates
    assert await state(conn, "1") == await state(conn, "3")


async def test_push_v3_within_call_duplicate_answers_the_first_item(conn: asyncpg.Connection) -> None:
    p = prepared_call([("q", "a", "x"), ("q", "b", "x"), ("q", "a", "y"), ("q", "a", "x"), ("q", "b", "x")], "3")
    (row,) = await conn.fetch(V3, *p.args_v3())
    assert list(row["dup_idx"]) == [4, 5]  # 1-based, item order; "x" on b is a new message of b
    assert list(row["dup_msgid"]) == [p.msgids[0], p.msgids[1]]
    assert list(row["dup_offset"]) == [0, 0]
    assert [(s, off) for s, _, _, off in push_engine.placed(p, row)] == [
        ("queued", 0),
        ("queued", 0),
        ("queued", 1),
        ("duplicate", 0),
        ("duplicate", 0),
    ]
    # no duplicate: empty arrays, not NULL (placed() zips them)
    q = prepared_call([("q", "a", "z")], "3")
    (row,) = await conn.fetch(V3, *q.args_v3())
    assert (row["dup_idx"], row["dup_msgid"], row["dup_offset"]) == ([], [], [])
    assert list(row["base_offsets"]) == [2]


@pytest.mark.parametrize("short", ["hashes", "msgids"])
async def test_push_v3_refuses_a_wrong_byte_count_and_writes_nothing(conn: asyncpg.Connection, short: str) -> None:
    p = prepared_call([("q", "a", "x"), ("q", "a", "y")], "3")
    args = list(p.args_v3())
    k = 4 if short == "hashes" else 5
    args[k] = args[k][:-1]
    with pytest.raises(asyncpg.InvalidParameterValueError, match="2 items"):
        await conn.fetch(V3, *args)
    assert await conn.fetchval("SELECT count(*) FROM queen.queues") == 0
    assert await conn.fetchval("SELECT count(*) FROM queen.log_txns") == 0


async def test_the_push_route_does_not_need_push_v1(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    """The broker's pushes (single, batch, interleaved groups, duplicates) go through push_v3 alone."""
    await conn.execute(
        "DROP FUNCTION queen.push_v1(text, text[], text[], bytea[], integer[], uuid[], uuid[], timestamptz,"
        " smallint[], boolean[])"
    )
    one = await push(http, "q", [{"payload": 1, "transactionId": "a"}], "p")
    assert [(r["status"], r["offset"]) for r in one] == [("queued", 0)]
    body = {
        "items": [
            {"queue": "q", "partition": "p", "payload": 2, "transactionId": "b"},
            {"queue": "q", "partition": "o", "payload": 3, "transactionId": "a"},
            {"queue": "q", "partition": "p", "payload": 4, "transactionId": "a"},
            {"queue": "q", "partition": "p", "payload": 5, "transactionId": "b"},
            {"queue": "q", "partition": "p", "payload": 6},
        ]
    }
    r = await http.post("/api/v1/push", json=body)
    assert r.status_code == 201, r.text
    res = r.json()
    assert [(x["index"], x["status"], x["partition"], x["offset"]) for x in res] == [
        (0, "queued", "p", 1),
        (1, "queued", "o", 0),
        (2, "duplicate", "p", 0),
        (3, "duplicate", "p", 1),
        (4, "queued", "p", 2),
    ]
    assert res[2]["messageId"] == one[0]["messageId"]
    assert res[3]["messageId"] == res[0]["messageId"]
    assert res[4]["transactionId"] == res[4]["messageId"]
    assert len({res[0]["partitionId"], res[1]["partitionId"]}) == 2 and res[2]["partitionId"] == res[0]["partitionId"]
    assert set(res[0]) == {
        "index", "status", "transactionId", "messageId", "queue", "partition", "partitionId", "offset", "error",
    }  # fmt: skip


async def test_previous_release_push_v1_and_push_v3_share_a_partition(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    """Rolling deploy: an old broker's push_v1 calls and this broker's pushes on one partition keep
    offsets gapless and deduplicate each other's transactionIds."""
    new = await push(http, "q", [{"payload": 1, "transactionId": "n1"}], "p")
    ids = [codec.uuid7(), codec.uuid7()]
    frames = [codec.encode_frame(i, t, b"0", None) for i, t in zip(ids, ["o1", "n1"], strict=True)]
    old = await conn.fetch(
        "SELECT * FROM queen.push_v1('default', $1, $2, $3, $4, $5, $6)",
        ["q"],
        ["p"],
        [codec.pack(frames)],
        [1, 1],
        [codec.txn_hash("o1"), codec.txn_hash("n1")],
        ids,
    )
    assert [(r["status"], r["msg_offset"]) for r in old] == [("queued", 1), ("duplicate", 0)]
    assert str(old[1]["message_id"]) == new[0]["messageId"]
    again = await push(http, "q", [{"payload": 2, "transactionId": "o1"}, {"payload": 3, "transactionId": "n2"}], "p")
    assert [(r["status"], r["offset"]) for r in again] == [("duplicate", 1), ("queued", 2)]
    assert again[0]["messageId"] == str(ids[0])


@pytest.mark.parametrize("fn", ["queen._push_core", "queen.push_v3"])
async def test_the_push_functions_use_generic_plans(conn: asyncpg.Connection, fn: str) -> None:
    """Guard: with custom plans PL/pgSQL planned every statement of a push on every call (measured:
    ~40 % of a 1-item push's PostgreSQL CPU); the SET clause must stay on the function."""
    config = await conn.fetchval("SELECT proconfig FROM pg_proc WHERE oid = $1::regproc", fn)
    assert config is not None and "plan_cache_mode=force_generic_plan" in config


@pytest.mark.parametrize(
    ("items", "status"),
    [
        # the pair (q, p) is checked once; a later item naming another partition is still checked
        ([("q", "p"), ("q", "p"), ("q", "x" * 300)], 413),
        ([("q", "p"), ("q" + "\x01", "p")], 400),
        ([("q", "p"), ("q", "p\n")], 400),
        ([("q", "Default"), ("", "Default")], 400),
    ],
)
async def test_every_distinct_name_of_a_body_is_still_checked(
    http: httpx.AsyncClient, conn: asyncpg.Connection, items: list[tuple[str, str]], status: int
) -> None:
    body = {"items": [{"queue": q, "partition": p, "payload": i} for i, (q, p) in enumerate(items)]}
    r = await http.post("/api/v1/push", json=body)
    assert r.status_code == status, r.text
    assert "error" in r.json()
    assert await conn.fetchval("SELECT count(*) FROM queen.queues") == 0


def test_uuid7_layout() -> None:
    import time

    ids = [codec.uuid7() for _ in range(5000)]
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    now_ms = time.time_ns() // 1_000_000
    assert all(0 <= now_ms - (i.int >> 80) < 60_000 for i in ids)
    assert len(set(ids)) == len(ids)
    random_bits = 0
    for i in ids:
        random_bits |= i.int & ((1 << 80) - 1)
    # every bit below the timestamp but the version (76-79) and variant (62-63) varies
    assert random_bits | (0xF << 76) | (0x3 << 62) == (1 << 80) - 1
    assert [i for i in ids if str(i) != str(uuid.UUID(bytes=i.bytes))] == []


# The one-group path of push_v3 (every item to one existing partition: three statements instead of
# _push_core's dozen) against the general path (push_v1 -> _push_core), call by call.
V1_AT = "SELECT * FROM queen.push_v1('default', $1, $2, $3, $4, $5, $6, $7)"
V3_AT = "SELECT * FROM queen.push_v3('default', $1, $2, $3, $4, $5, $6, $7)"


def one_group_calls(seed: int, distinct: bool = False) -> list[tuple[int, list[tuple[str, str, str]]]]:
    """(seconds since the start, items) calls to ONE partition per call (q/a, q/b, r/a), transactionIds
    from a small pool: duplicates inside a call, of earlier calls, and after the dedup window (60 s).
    ``distinct``: no transactionId twice in a call, from a larger pool (the several-item path's insert
    without verdicts when no stored row of the call's hashes is inside the window, its verdict
    statement when one is)."""
    rnd = random.Random(seed)
    out = []
    t = 0
    for _ in range(14):
        t += rnd.choice([1, 5, 70])  # 70 s: the window of earlier pushes has passed
        q, p = rnd.choice([("q", "a"), ("q", "b"), ("r", "a")])
        n = rnd.choice([1, 1, 2, 8, 30])
        txns = rnd.sample(range(32), n) if distinct else [rnd.randint(0, 12) for _ in range(n)]
        out.append((t, [(q, p, f"t{k}") for k in txns]))
    return out


@pytest.mark.parametrize(
    ("seed", "distinct"), [(4, False), (5, False), (6, False), (7, False), (4, True), (5, True), (6, True), (8, True)]
)
async def test_one_group_path_answers_and_stores_what_the_general_path_does(
    conn: asyncpg.Connection, seed: int, distinct: bool
) -> None:
    import datetime

    for name in ("1q", "3q"):
        await conn.execute(
            "SELECT queen.configure_queue_v1('default', $1, NULL, NULL, '{\"dedupWindowSeconds\": 60}'::jsonb)", name
        )
    t0 = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
    same = SameVerdicts()
    for c, (t, items) in enumerate(one_group_calls(seed, distinct)):
        now = t0 + datetime.timedelta(seconds=t)
        p1 = prepared_call(items, "1")
        v1 = push_engine.rows_placed(await conn.fetch(V1_AT, *p1.args(), now))
        p3 = prepared_call(items, "3")
        (row,) = await conn.fetch(V3_AT, *p3.args_v3(), now)
        same.check(c, items, v1, push_engine.placed(p3, row), p1.msgids, p3.msgids)
    # duplicates (fewer without repeats inside a call), and repeats queued again after the window
    assert same.dups > (1 if distinct else 5) and same.queued_again > 0
    assert await state(conn, "1") == await state(conn, "3")
    await same_stored(conn)  # the stored hashes, ids and times too (the general path's are the reference)


@pytest.mark.parametrize("n", [1, 3])  # the one-item statements and the set statement
async def test_one_group_path_creates_nothing_itself_and_refuses_a_sealing_mismatch(
    conn: asyncpg.Connection, n: int
) -> None:
    # a new queue and partition: created (the general path), then the one-group path appends
    first = prepared_call([("q", "a", "x")], "")
    (row,) = await conn.fetch(V3, *first.args_v3())
    assert list(row["base_offsets"]) == [0]
    second = prepared_call([("q", "a", "y"), ("q", "a", "x")], "")
    (row,) = await conn.fetch(V3, *second.args_v3())
    assert (list(row["base_offsets"]), list(row["dup_idx"]), list(row["dup_msgid"])) == ([1], [2], [first.msgids[0]])
    # sealed items to a plain queue: refused, nothing written
    before = await state(conn, "q")
    third = prepared_call([("q", "a", f"z{i}") for i in range(n)], "")
    with pytest.raises(asyncpg.PostgresError, match="encryption_mismatch") as exc:
        await conn.fetch(
            "SELECT * FROM queen.push_v3('default', $1, $2, $3, $4, $5, $6, NULL, NULL, $7)", *third.args_v3(), [True]
        )
    assert exc.value.detail == '{"q": false}'
    assert await state(conn, "q") == before
    assert await conn.fetchval("SELECT count(*) FROM queen.log_txns") == 2


@pytest.mark.parametrize("n", [1, 3])
async def test_one_group_path_wakes_caught_up_cursors(conn: asyncpg.Connection, n: int) -> None:
    p = prepared_call([("q", "a", "x")], "")
    await conn.fetch(V3, *p.args_v3())
    await conn.execute(
        "INSERT INTO queen.log_consumers (partition_id, consumer_group, queue_id, tenant, cursor_offset, head_at)"
        " SELECT p.id, 'g', p.queue_id, 'default', 1, NULL FROM queen.log_partitions p"
    )
    assert await conn.fetchval("SELECT head_at FROM queen.log_consumers") is None  # caught up
    p = prepared_call([("q", "a", "x")] * n, "")  # duplicates only: no message, the cursor stays caught up
    (row,) = await conn.fetch(V3, *p.args_v3())
    assert list(row["dup_idx"]) == list(range(1, n + 1))
    assert await conn.fetchval("SELECT head_at FROM queen.log_consumers") is None
    p = prepared_call([("q", "a", f"y{i}") for i in range(n)], "")
    await conn.fetch(V3, *p.args_v3())
    assert await conn.fetchval("SELECT head_at FROM queen.log_consumers") is not None


async def test_deleting_a_queue_deletes_its_txns(conn: asyncpg.Connection) -> None:
    """log_txns has no foreign key (revision 0009): delete_queue_v1 deletes the rows itself."""
    for q in ("q", "r"):
        p = prepared_call([(q, "a", "x"), (q, "b", "y")], "")
        await conn.fetch(V3, *p.args_v3())
    assert await conn.fetchval("SELECT queen.delete_queue_v1('default', 'q')") is True
    orphans = await conn.fetchval(
        "SELECT count(*) FROM queen.log_txns t"
        " WHERE NOT EXISTS (SELECT 1 FROM queen.log_partitions p WHERE p.id = t.partition_id)"
    )
    assert orphans == 0
    assert await conn.fetchval("SELECT count(*) FROM queen.log_txns") == 2


# _push_core's statement for one item per group (fused 1-item pushes to several partitions) against its
# general steps, call by call: the same items with the groups listed in reverse skip it (item i is then
# not in group i).
def one_per_group_calls(seed: int) -> list[tuple[int, list[tuple[str, str, str]]]]:
    """(seconds since the start, items) calls of one item to each of 2-4 partitions, transactionIds from
    a small pool: duplicates of earlier calls, across partitions (not duplicates there), and after the
    dedup window (60 s)."""
    rnd = random.Random(seed)
    parts = [("q", "a"), ("q", "b"), ("r", "a"), ("r", "c")]
    out = []
    t = 0
    for _ in range(16):
        t += rnd.choice([1, 5, 70])
        out.append((t, [(q, p, f"t{rnd.randint(0, 5)}") for q, p in rnd.sample(parts, rnd.randint(2, 4))]))
    return out


@pytest.mark.parametrize("seed", [8, 9, 10])
async def test_one_item_per_group_answers_and_stores_what_the_general_steps_do(
    conn: asyncpg.Connection, seed: int
) -> None:
    import datetime

    for name in ("1q", "1r", "3q", "3r"):
        await conn.execute(
            "SELECT queen.configure_queue_v1('default', $1, NULL, NULL, '{\"dedupWindowSeconds\": 60}'::jsonb)", name
        )
    t0 = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
    same = SameVerdicts()
    for c, (t, items) in enumerate(one_per_group_calls(seed)):
        now = t0 + datetime.timedelta(seconds=t)
        n = len(items)
        p1 = prepared_call(items, "1")
        assert p1.item_group == list(range(1, n + 1))  # item i in group i: the one-statement path
        one = push_engine.rows_placed(await conn.fetch(V1_AT, *p1.args(), now))
        p3 = prepared_call(items, "3")
        general = push_engine.rows_placed(
            await conn.fetch(
                V1_AT,
                p3.queues[::-1],
                p3.partitions[::-1],
                p3.blobs[::-1],
                [n - i for i in range(n)],
                p3.hashes,
                p3.msgids,
                now,
            )
        )
        same.check(c, items, one, general, p1.msgids, p3.msgids)
    assert same.dups > 5 and same.queued_again > 0
    assert await state(conn, "1") == await state(conn, "3")
    await same_stored(conn, blobs_too=True)


async def test_one_item_per_group_refuses_a_sealing_mismatch_and_wakes_caught_up_cursors(
    conn: asyncpg.Connection,
) -> None:
    first = prepared_call([("q", "a", "x"), ("r", "a", "x")], "")
    (row,) = await conn.fetch(V3, *first.args_v3())
    assert list(row["base_offsets"]) == [0, 0]
    await conn.execute(
        "INSERT INTO queen.log_consumers (partition_id, consumer_group, queue_id, tenant, cursor_offset, head_at)"
        " SELECT p.id, 'g', p.queue_id, 'default', 1, NULL FROM queen.log_partitions p"
    )
    # one of two groups sealed for a plain queue: refused, nothing written
    before = await state(conn, "")
    second = prepared_call([("q", "a", "y"), ("r", "a", "y")], "")
    with pytest.raises(asyncpg.PostgresError, match="encryption_mismatch") as exc:
        await conn.fetch(
            "SELECT * FROM queen.push_v3('default', $1, $2, $3, $4, $5, $6, NULL, NULL, $7)",
            *second.args_v3(),
            [False, True],
        )
    assert exc.value.detail == '{"q": false, "r": false}'
    assert await state(conn, "") == before
    # a duplicate in q/a, a message in r/a: only r/a's caught-up cursor becomes pending
    third = prepared_call([("q", "a", "x"), ("r", "a", "z")], "")
    (row,) = await conn.fetch(V3, *third.args_v3())
    assert (list(row["base_offsets"]), list(row["dup_idx"]), list(row["dup_offset"])) == ([1, 1], [1], [0])
    heads = await conn.fetch(
        "SELECT p.name AS p, q.name AS q, c.head_at FROM queen.log_consumers c"
        " JOIN queen.log_partitions p ON p.id = c.partition_id JOIN queen.queues q ON q.id = p.queue_id ORDER BY 2"
    )
    assert [(r["q"], r["head_at"] is None) for r in heads] == [("q", True), ("r", False)]
