"""The JSON pop answer rendered to bytes (queen_pg/engine/pop_render.py) says exactly what the dict
rendering it replaced said (docs/wire.md#pop), byte for byte; the segment cache shares decodes between
groups, stays within its byte budget, never serves a changed blob, and never holds an encrypted
queue's plaintext. Rows come from the real queen.pop_v1; some are varied by hand (passed offsets,
redelivery) to reach every branch."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from queen_pg.engine import codec, pop_render
from queen_pg.engine.pop import iso_ms
from queen_pg.errors import ENCRYPTION_KEY_UNKNOWN, QueenError
from queen_pg.security import crypto
from tests.conftest import Broker, broker_settings
from tests.helpers import pop, push

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POP = "SELECT * FROM queen.pop_v1('default', $1, NULL, NULL, NULL, $2, $3, 10, $4, $5, NULL, NULL, $6)"
Row = dict[str, Any]


TENANT = "default"


def place(row: Row) -> crypto.Place:
    return crypto.Place(TENANT, row["queue_name"], row["partition_name"])


def reference(rows: list[Row], lease: str | None, group: str | None, autopilot: bool, vault: Any = None) -> Any:
    """The dict rendering pop.render had before it rendered to bytes (kept here as the oracle)."""
    messages: list[dict[str, Any]] = []
    claims: list[tuple[str, str, str]] = []
    for row in rows:
        pid = str(row["partition_id"])
        if not claims or claims[-1][0] != pid:
            claims.append((pid, row["partition_name"], row["queue_name"]))
        start, end = row["lease_start"], row["lease_end"]
        acked = set(row["acked"] or ())
        dropped = set(row["dropped"] or ())
        off = row["base_offset"]
        for i, frame in enumerate(codec.unpack(row["payload"], row["codec"])):
            if i in dropped:
                continue
            if start <= off < end and off not in acked:
                attempt = row["attempts"] if off < row["redelivered_end"] else 1
                messages.append(
                    {
                        "id": str(frame.message_id),
                        "transactionId": frame.transaction_id,
                        "partitionId": pid,
                        "partition": row["partition_name"],
                        "queue": row["queue_name"],
                        "leaseId": lease,
                        "consumerGroup": group,
                        "data": orjson.Fragment(crypto.opened(vault, frame, place(row))),
                        "createdAt": iso_ms(row["created_at"]),
                        "traceId": str(frame.trace_id) if frame.trace_id else None,
                        "producerSub": frame.producer_sub,
                        "deliveryAttempt": attempt,
                        "retryCount": attempt - 1,
                        "offset": off,
                    }
                )
            off += 1
    if not messages:
        return None
    answer: dict[str, Any] = {
        "success": True,
        "queue": claims[0][2],
        "partition": claims[0][1],
        "partitionId": claims[0][0],
        "leaseId": lease or "",
        "consumerGroup": group,
        "partitionsClaimed": len(claims),
        "messages": messages,
    }
    if autopilot:
        answer["autopilot"] = {"partitions": len(claims), "batch": len(messages), "waitMs": 0}
    return answer


async def push_frames(
    conn: asyncpg.Connection,
    queue: str,
    partition: str,
    frames: list[tuple[str, bytes, uuid.UUID | None, str | None]],
    now: datetime = T0,
    codec_id: int = codec.CODEC_ZSTD,
    sealed: bool = False,
) -> None:
    """One segment through queen.push_v1: (transactionId, payload, traceId, producerSub) per frame."""
    ids = [codec.uuid7() for _ in frames]
    raw = [codec.encode_frame(i, t, p, tr, sub, sealed) for i, (t, p, tr, sub) in zip(ids, frames, strict=True)]
    blob = codec.pack(raw) if codec_id == codec.CODEC_ZSTD else b"".join(raw)
    await conn.execute(
        "SELECT queen.push_v1('default', $1, $2, $3, $4, $5, $6, $7, $8, $9)",
        [queue],
        [partition],
        [blob],
        [1] * len(frames),
        [codec.txn_hash(t) for t, *_ in frames],
        ids,
        now,
        [codec_id],
        [sealed] if sealed else None,
    )


async def claim(conn: asyncpg.Connection, queue: str, group: str, batch: int, auto_ack: bool = False) -> list[Row]:
    rows = await conn.fetch(POP, queue, group, batch, uuid.uuid4(), auto_ack, T0 + timedelta(seconds=1))
    return [dict(r) for r in rows]


def both(rows: list[Row], lease: str | None, group: str | None, autopilot: bool = False,
         cache: pop_render.SegmentCache | None = None, vault: Any = None) -> bytes:  # fmt: skip
    """Render with the new code, assert it equals the oracle byte for byte, and return it."""
    got = pop_render.render(rows, lease, group, autopilot, cache or pop_render.SegmentCache(1 << 20), vault,
                            tenant=TENANT)  # fmt: skip
    want = reference(rows, lease, group, autopilot, vault)
    if want is None:
        assert got is None
        return b""
    assert got is not None
    assert got.body == orjson.dumps(want)
    assert got.messages == len(want["messages"])
    return got.body


MIXED = [
    ("plain", b'{"a":1}', None, None),
    ('q"uo\\te\u00e9\u2028', b'[1,2.5,"x"]', uuid.uuid4(), "alice"),
    ("emoji-\U0001f600", b'"\\u0000 nul in a string"', None, 'sub "with" quotes'),
    ("big", b"18446744073709551615", uuid.uuid4(), None),
    ("null", b"null", None, ""),
]


async def test_every_shape_renders_as_the_dict_did(conn: asyncpg.Connection) -> None:
    await push_frames(conn, "r", "p1", MIXED)
    await push_frames(conn, "r", "p1", [(f"raw{i}", b"%d" % i, None, None) for i in range(3)],
                      codec_id=codec.CODEC_RAW)  # fmt: skip
    rows = await claim(conn, "r", "g", 100)
    assert len(rows) == 2
    lease = str(uuid.uuid4())
    body = both(rows, lease, "g")
    assert [m["transactionId"] for m in orjson.loads(body)["messages"]] == [t for t, *_ in MIXED] + [
        "raw0",
        "raw1",
        "raw2",
    ]
    both(rows, lease, "g", autopilot=True)
    both(rows, None, None)  # autoAck in queue mode: leaseId null per message, "" in the head
    # a redelivered part (attempts 3 below offset 4), offsets the group passes over, a partial lease
    varied = [{**r, "attempts": 3, "redelivered_end": 4, "acked": [1, 5], "lease_start": 1, "lease_end": 7}
              for r in rows]  # fmt: skip
    out = orjson.loads(both(varied, lease, "g"))
    assert [(m["offset"], m["deliveryAttempt"], m["retryCount"]) for m in out["messages"]] == [
        (2, 3, 2),
        (3, 3, 2),
        (4, 1, 0),
        (6, 1, 0),
    ]
    # nothing leased in these segments: no answer
    assert pop_render.render([{**r, "lease_start": 50, "lease_end": 60} for r in rows], lease, "g", False,
                             pop_render.SegmentCache(0), tenant=TENANT) is None  # fmt: skip


async def test_dropped_duplicates_and_several_partitions(conn: asyncpg.Connection) -> None:
    await push_frames(conn, "d", "a", [("x", b"1", None, None)])
    # "x" again (dropped: a duplicate within the window), then "y": the segment holds 2 frames, 1 live
    await push_frames(conn, "d", "a", [("x", b"2", None, None), ("y", b"3", None, None)])
    await push_frames(conn, "d", "b", [("z", b"4", None, None)])
    rows = await claim(conn, "d", "g", 100)
    assert any(r["dropped"] for r in rows) and len({r["partition_id"] for r in rows}) == 2
    out = orjson.loads(both(rows, "L", "g", autopilot=True))
    assert [m["transactionId"] for m in out["messages"]] == ["x", "y", "z"]
    assert out["partitionsClaimed"] == 2 and out["autopilot"] == {"partitions": 2, "batch": 3, "waitMs": 0}


async def test_a_partial_lease_decodes_only_the_leased_frames(conn: asyncpg.Connection) -> None:
    await push_frames(conn, "p", "p", [(f"t{i}", b"%d" % i, None, None) for i in range(10)])
    cache = pop_render.SegmentCache(1 << 20)
    rows = await claim(conn, "p", "g", 3)
    both(rows, "L", "g", cache=cache)
    (seg,) = cache._entries.values()
    assert [p is not None for p in seg.pieces] == [True] * 3 + [False] * 7
    rows = await claim(conn, "p", "h", 2)  # another group, the same segment: a hit, 2 frames already decoded
    both(rows, "L2", "h", cache=cache)
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)
    assert sum(p is not None for p in seg.pieces) == 3


async def test_groups_share_one_decode_and_each_sees_its_own_lease(conn: asyncpg.Connection) -> None:
    await push_frames(conn, "f", "p", MIXED)
    cache = pop_render.SegmentCache(1 << 20)
    bodies = []
    for g in ("g1", "g2", "g3"):
        lease = str(uuid.uuid4())
        body = orjson.loads(both(await claim(conn, "f", g, 100), lease, g, cache=cache))
        assert {(m["leaseId"], m["consumerGroup"]) for m in body["messages"]} == {(lease, g)}
        bodies.append([{k: v for k, v in m.items() if k not in ("leaseId", "consumerGroup")} for m in body["messages"]])
    assert bodies[0] == bodies[1] == bodies[2]
    assert (cache.stats.misses, cache.stats.hits, cache.entries) == (1, 2, 1)


def fake_row(pid: int, base: int, frames: list[bytes], created: datetime = T0) -> Row:
    return {"queue_name": "q", "partition_id": pid, "partition_name": "p", "lease_start": base,
            "lease_end": base + len(frames), "redelivered_end": base, "attempts": 1, "acked": None,
            "lease_expires_at": None, "base_offset": base, "end_offset": base + len(frames), "created_at": created,
            "dropped": None, "codec": codec.CODEC_ZSTD, "payload": codec.pack(frames)}  # fmt: skip


def frames(n: int, payload: bytes = b'"x"') -> list[bytes]:
    return [codec.encode_frame(codec.uuid7(), f"t{i}", payload, None) for i in range(n)]


def test_the_cache_stays_within_its_bytes_and_evicts_the_least_recently_used() -> None:
    rows = [fake_row(1, 100 * i, frames(100, b'"' + b"y" * 200 + b'"')) for i in range(40)]
    one = pop_render.SegmentCache(1 << 30)
    both([rows[0]], "L", "g", cache=one)
    budget = int(one.bytes * 3.5)  # room for three rendered segments
    cache = pop_render.SegmentCache(budget)
    for r in rows:
        both([r], "L", "g", cache=cache)
        assert cache.bytes <= budget
    assert cache.entries == 3 and cache.stats.evictions == 37
    both([rows[-1]], "L", "g", cache=cache)  # recent: a hit
    both([rows[0]], "L", "g", cache=cache)  # long gone: decoded again
    assert (cache.stats.hits, cache.stats.misses) == (1, 41)
    tiny = pop_render.SegmentCache(100)  # a segment bigger than the whole cache is rendered, not kept
    both([rows[1]], "L", "g", cache=tiny)
    assert tiny.entries == 0 and tiny.bytes == 0


def test_a_changed_blob_under_the_same_segment_identity_is_never_served_stale() -> None:
    cache = pop_render.SegmentCache(1 << 20)
    old = fake_row(7, 0, [codec.encode_frame(codec.uuid7(), "a", b'"old"', None)])
    new = fake_row(7, 0, [codec.encode_frame(codec.uuid7(), "a", b'"new"', None)])  # e.g. a rewound database
    assert orjson.loads(both([old], "L", "g", cache=cache))["messages"][0]["data"] == "old"
    assert orjson.loads(both([new], "L", "g", cache=cache))["messages"][0]["data"] == "new"
    assert cache.stats.misses == 2


def test_the_disabled_cache_keeps_nothing() -> None:
    cache = pop_render.SegmentCache(0)
    row = fake_row(1, 0, frames(5))
    both([row], "L", "g", cache=cache)
    both([row], "L", "g", cache=cache)
    assert cache.entries == 0 and cache.bytes == 0 and cache.stats.hits == 0


def _holds(cache: pop_render.SegmentCache, needle: bytes) -> bool:
    for seg in cache._entries.values():
        if needle in seg.raw or any(p is not None and any(needle in x for x in p if isinstance(x, bytes))
                                    for p in seg.pieces):  # fmt: skip
            return True
    return False


def test_an_encrypted_queue_s_plaintext_is_never_cached() -> None:
    v = crypto.Vault(b"k" * 32)
    secret = b'{"card":"4111-1111-1111-1111"}'
    here = crypto.Place(TENANT, "q", "p")  # fake_row's queue and partition
    sealed = [codec.encode_frame(codec.uuid7(), f"s{i}", v.seal(secret, here), None, None, True) for i in range(3)]
    cache = pop_render.SegmentCache(1 << 20)
    row = fake_row(3, 0, sealed)
    for _ in range(2):
        body = both([row], "L", "g", cache=cache, vault=v)
        assert [m["data"] for m in orjson.loads(body)["messages"]] == [{"card": "4111-1111-1111-1111"}] * 3
    assert cache.stats.hits == 1 and cache.entries == 1
    assert not _holds(cache, b"4111-1111")  # only the sealed bytes, opened per pop
    # a broker without the key: 409, and the cache still holds no plaintext
    with pytest.raises(QueenError) as err:
        pop_render.render([row], "L", "g", False, cache, crypto.Vault(), tenant=TENANT)
    assert err.value.kind is ENCRYPTION_KEY_UNKNOWN
    assert not _holds(cache, b"4111-1111")


async def test_a_broker_pop_answers_the_rendered_bytes(broker: Broker, http: httpx.AsyncClient) -> None:
    await push(http, "h", [{"payload": {"i": i}, "transactionId": f"t{i}"} for i in range(5)])
    for g in ("g1", "g2"):
        ans = await pop(http, "h", consumerGroup=g, batch=10)
        assert ans is not None and [m["data"] for m in ans["messages"]] == [{"i": i} for i in range(5)]
        assert all(m["consumerGroup"] == g and m["leaseId"] == ans["leaseId"] for m in ans["messages"])
    cache = pop_render.cache_of(broker.app.state.queen.db)
    assert cache.max_bytes == broker_settings("x").pop_cache_mb * 1024 * 1024
    assert cache.stats.hits >= 1  # the second group read the first one's decode
    text = (await http.get("/metrics")).text
    assert 'queen_pop_cache_lookups_total{result="hit"}' in text and "queen_pop_cache_bytes " in text
    hits = next(ln for ln in text.splitlines() if ln.startswith('queen_pop_cache_lookups_total{result="hit"}'))
    assert float(hits.split()[-1]) == cache.stats.hits
    assert cache.bytes > 0
