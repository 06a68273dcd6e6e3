"""A push's answer rendered straight to bytes (queen_pg/engine/push.py ``answer``/``Answer``): the bytes
are exactly what the per-item dicts + orjson gave before (docs/wire.md#push: field names, order, types;
a duplicate carries the original's message id and offset), for the JSON and binary paths, fused or
alone, with and without transactionIds, under a request key (recorded and replayed), and the counts
the route derives from it (metrics, waiters) are the items'.

``legacy_render``/``legacy_binary_render`` are the renderers this replaced, kept here verbatim as the
reference."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Sequence
from typing import Any

import httpx
import orjson
import pytest
from queen.http.push_binary import PushBatch, encode_push_frames

from queen_pg.db.pool import Database
from queen_pg.db.types import fast_uuid
from queen_pg.engine import push as push_engine
from queen_pg.engine import push_binary
from queen_pg.engine.binary import Group
from queen_pg.engine.fusion import FuseConfig, Fuser
from queen_pg.engine.push import NewMessage, Placed
from tests.conftest import Broker


def legacy_render(items: Sequence[NewMessage], rows: Sequence[Placed]) -> list[dict[str, Any]]:
    """queen_pg/engine/push.py ``_render`` before the answer went straight to bytes."""
    out: list[dict[str, Any]] = []
    pid_text: dict[int, str] = {}
    for i, ((status, mid, pid, off), item) in enumerate(zip(rows, items, strict=True)):
        ptext = pid_text.get(pid)
        if ptext is None:
            ptext = pid_text[pid] = str(pid)
        mtext = str(mid)
        out.append(
            {
                "index": i,
                "status": status,
                "transactionId": item.transaction_id or mtext,
                "messageId": mtext,
                "queue": item.queue,
                "partition": item.partition,
                "partitionId": ptext,
                "offset": off,
                "error": None,
            }
        )
    return out


def legacy_binary_render(groups: Sequence[Group], placed: Sequence[Placed]) -> list[dict[str, Any]]:
    """queen_pg/engine/push_binary.py ``render`` before."""
    out: list[dict[str, Any]] = []
    i = 0
    for g in groups:
        q, p = g.queue, g.partition
        ptext = ""
        for txn in g.txns:
            status, mid, pid, off = placed[i]
            if not ptext:
                ptext = str(pid)
            out.append(
                {
                    "index": i,
                    "status": status,
                    "transactionId": txn,
                    "messageId": str(mid),
                    "queue": q,
                    "partition": p,
                    "partitionId": ptext,
                    "offset": off,
                    "error": None,
                }
            )
            i += 1
    return out


# transactionIds and names orjson writes in every way it can: plain, escaped (quote, backslash, control
# characters, short and \u forms), non-ASCII as UTF-8 (2-, 3-, 4-byte, U+2028, DEL), empty
AWKWARD = ["plain", 'q"uote', "back\\slash", "tab\there", "nl\nx", "\x01\x1f", "\x7f", "é", "日本", "🎉", "\u2028", ""]


def _uuid(rng: random.Random) -> uuid.UUID:
    return fast_uuid(rng.randbytes(16))


def _case(rng: random.Random) -> tuple[list[NewMessage], list[Placed]]:
    """A request of 1..40 items over 1..4 (queue, partition) homes, each item a queued one or a
    duplicate (of an earlier item or of something stored before), with or without a transactionId."""
    homes = [
        (rng.choice(["q", "orders", "é-q", "q/2"]), rng.choice(["Default", "p1", "日本", "p 2"])) for _ in range(4)
    ]
    pids = {h: rng.randrange(1, 10**12) for h in homes}
    nxt = {h: rng.randrange(0, 10**15) for h in homes}
    items: list[NewMessage] = []
    rows: list[Placed] = []
    for _ in range(rng.randrange(1, 41)):
        home = rng.choice(homes[: rng.randrange(1, 5)])
        kind = rng.random()
        txn: str | None = None if kind < 0.3 else rng.choice(AWKWARD) + str(rng.randrange(5))
        items.append(NewMessage(home[0], home[1], b"1", txn, None))
        if txn is not None and rng.random() < 0.3:  # a duplicate: the original's id and offset
            rows.append(("duplicate", _uuid(rng), pids[home], rng.randrange(0, nxt[home] + 1)))
        else:
            rows.append(("queued", _uuid(rng), pids[home], nxt[home]))
            nxt[home] += 1
    return items, rows


def test_the_answer_bytes_are_what_the_dicts_rendered_by_orjson_were() -> None:
    rng = random.Random(14)
    for _ in range(3000):
        items, rows = _case(rng)
        old = legacy_render(items, rows)
        new = push_engine.answer(rows, [it.transaction_id for it in items], items)
        assert new.body == orjson.dumps(old), (items, rows)
        assert list(new) == old and len(new) == len(old) and new[0] == old[0] and new[-1] == old[-1]
        assert new.queued == sum(r["status"] == "queued" for r in old)
        assert new.duplicates == len(old) - new.queued
        assert sorted(new.queues) == sorted({r["queue"] for r in old if r["status"] == "queued"})


def test_every_request_of_a_fused_push_v3_row_gets_the_old_bytes() -> None:
    # answers_v3 (the engine's path) against the old one: placed() per item, sliced per request, the
    # dicts rendered by orjson; push_v3's row as it answers it, over requests on one or several
    # partitions, with and without duplicates (listed by 1-based index, the original's id and offset)
    rng = random.Random(3)
    for _ in range(1500):
        homes = [(rng.choice(["q", "é"]), rng.choice(["Default", "p1", 'p"2'])) for _ in range(3)]
        requests = []
        for _r in range(rng.randrange(1, 5)):
            spread = rng.randrange(1, 4)
            req = []
            for _i in range(rng.choice([1, 1, 2, 7, 30])):
                q, p = rng.choice(homes[:spread])
                txn = None if rng.random() < 0.4 else rng.choice(AWKWARD) + str(rng.randrange(9))
                req.append(NewMessage(q, p, b"1", txn, None))
            requests.append(req)
        flat = [it for req in requests for it in req]
        prepared = push_engine.prepare(flat)
        n_groups = len(prepared.queues)
        dups = sorted(
            rng.sample(range(1, len(flat) + 1), min(len(flat), rng.randrange(0, 3)) if rng.random() < 0.3 else 0)
        )
        row = {
            "partition_ids": [rng.randrange(1, 10**9) for _ in range(n_groups)],
            "base_offsets": [rng.randrange(0, 10**6) for _ in range(n_groups)],
            "dup_idx": dups or None,
            "dup_msgid": [_uuid(rng) for _ in dups] or None,
            "dup_offset": [rng.randrange(0, 10**6) for _ in dups] or None,
        }
        rows = push_engine.placed(prepared, row)  # type: ignore[arg-type]
        answers = push_engine.answers_v3(prepared, row, requests)  # type: ignore[arg-type]
        at = 0
        for req, ans in zip(requests, answers, strict=True):
            old = legacy_render(req, rows[at : at + len(req)])
            at += len(req)
            assert ans.body == orjson.dumps(old), (req, row)
            assert (ans.queued, ans.duplicates) == (
                sum(r["status"] == "queued" for r in old),
                len(dups and [r for r in old if r["status"] == "duplicate"]),
            )
            assert sorted(ans.queues) == sorted({r["queue"] for r in old if r["status"] == "queued"})


def test_the_binary_answer_keeps_each_frames_transaction_id() -> None:
    rng = random.Random(8)
    for _ in range(500):
        groups = []
        for g in range(rng.randrange(1, 4)):
            txns = [rng.choice(AWKWARD) + str(n) for n in range(rng.randrange(1, 20))]
            groups.append(Group(f"q{g}", rng.choice(["Default", "é"]), txns, [b"1"] * len(txns)))
        rows: list[Placed] = []
        for g, grp in enumerate(groups):
            for n in range(len(grp)):
                status = "duplicate" if rng.random() < 0.2 else "queued"
                rows.append((status, _uuid(rng), 100 + g, n))
        new = push_binary.render(groups, rows)
        assert new.body == orjson.dumps(legacy_binary_render(groups, rows))
        assert push_binary.counts(new) == {
            "count": len(rows),
            "queued": sum(r[0] == "queued" for r in rows),
            "duplicate": sum(r[0] == "duplicate" for r in rows),
            "error": None,
        }


def test_a_transaction_id_orjson_cannot_write_fails_as_it_did() -> None:
    # a lone surrogate cannot be UTF-8: the old rendering raised (orjson), so does the new one
    items = [NewMessage("q", "Default", b"1", "bad\ud800", None)]
    rows: list[Placed] = [("queued", uuid.uuid4(), 1, 0)]
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(legacy_render(items, rows))
    with pytest.raises((orjson.JSONEncodeError, UnicodeEncodeError)):
        push_engine.answer(rows, ["bad\ud800"], items)


async def test_fused_requests_each_get_the_old_bytes_for_what_the_database_decided(db: Database) -> None:
    # three requests in one push_v3 call: several queues and partitions, a duplicate inside a request,
    # one across requests (the first one's id and offset), one of a message stored by an earlier call,
    # items with and without transactionIds, and awkward characters
    (first,) = await push_engine.push_many(db, "default", [[NewMessage("a", "p1", b"0", 'old"one', None)]])
    requests = [
        [
            NewMessage("a", "p1", b"1", "x\\1", None),
            NewMessage("b", "Default", b"2", None, None),
            NewMessage("a", "p1", b"3", "x\\1", None),  # a duplicate in the request
            NewMessage("a", "日本", b"4", "🎉", None),
        ],
        [NewMessage("a", "p1", b"5", 'old"one', None), NewMessage("b", "Default", b"6", None, None)],
        [NewMessage("b", "p\t2", b"7", "x\\1", None), NewMessage("a", "p1", b"8", "x\\1", None)],
    ]
    fuser = Fuser(db, FuseConfig(max_items=8, hold_us=60_000_000, inflight=0))  # one batch, when full
    answers = await asyncio.gather(*(fuser.push("default", req) for req in requests))
    assert fuser.push_lane("default").stats.calls == 1
    for req, ans in zip(requests, answers, strict=True):
        rows = [(r["status"], uuid.UUID(r["messageId"]), int(r["partitionId"]), r["offset"]) for r in ans]
        assert ans.body == orjson.dumps(legacy_render(req, rows))
    a, b, c = (list(x) for x in answers)
    assert [r["status"] for r in a] == ["queued", "queued", "duplicate", "queued"]
    assert [(r["index"], r["offset"]) for r in a] == [(0, 1), (1, 0), (2, 1), (3, 0)]
    assert a[2]["messageId"] == a[0]["messageId"] and a[1]["transactionId"] == a[1]["messageId"]
    assert b[0]["status"] == "duplicate" and (b[0]["messageId"], b[0]["offset"]) == (first[0]["messageId"], 0)
    assert (b[1]["status"], b[1]["offset"]) == ("queued", 1)
    assert [r["status"] for r in c] == ["queued", "duplicate"]
    assert (c[1]["messageId"], c[1]["offset"]) == (a[0]["messageId"], 1)  # the earlier request's
    assert (answers[0].queued, answers[0].duplicates, sorted(answers[0].queues)) == (3, 1, ["a", "b"])
    assert (answers[1].queued, answers[1].duplicates, answers[1].queues) == (1, 1, ("b",))
    assert (answers[2].queued, answers[2].duplicates, answers[2].queues) == (1, 1, ("b",))


async def _pushed(http: httpx.AsyncClient) -> tuple[float, float]:
    text = (await http.get("/metrics")).text

    def value(name: str) -> float:
        lines = [ln for ln in text.splitlines() if ln.startswith(name + "{")]
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines)

    return value("queen_messages_pushed_total"), value("queen_messages_push_duplicates_total")


async def test_http_push_answers_the_old_bytes_and_counts_per_request(http: httpx.AsyncClient) -> None:
    before = await _pushed(http)
    items: list[dict[str, Any]] = [
        {"queue": "h", "partition": "p1", "payload": {"n": 1}, "transactionId": "t\u2028"},
        {"queue": "h", "payload": 2},
        {"queue": "h2", "partition": "p1", "payload": 3, "transactionId": "t\u2028"},  # another queue: new
        {"queue": "h", "partition": "p1", "payload": 4, "transactionId": "t\u2028"},  # duplicate of item 0
    ]
    r = await http.post("/api/v1/push", json={"items": items})
    assert r.status_code == 201 and r.headers["content-type"] == "application/json"
    got = r.json()
    homes = [NewMessage(i["queue"], i.get("partition", "Default"), b"", i.get("transactionId"), None) for i in items]
    rows = [(x["status"], uuid.UUID(x["messageId"]), int(x["partitionId"]), x["offset"]) for x in got]
    assert r.content == orjson.dumps(legacy_render(homes, rows))
    assert [x["status"] for x in got] == ["queued", "queued", "queued", "duplicate"]
    assert got[3]["messageId"] == got[0]["messageId"] and got[3]["offset"] == got[0]["offset"]
    after = await _pushed(http)
    assert (after[0] - before[0], after[1] - before[1]) == (3, 1)

    one = await http.post("/api/v1/push", json={"items": [{"queue": "h", "payload": 5}]})
    (x,) = one.json()
    assert one.content == orjson.dumps(
        legacy_render(
            [NewMessage("h", "Default", b"", None, None)],
            [("queued", uuid.UUID(x["messageId"]), int(x["partitionId"]), 1)],
        )
    )


async def test_a_keyed_push_replays_the_same_bytes(http: httpx.AsyncClient) -> None:
    body = {"items": [{"queue": "k", "payload": 1, "transactionId": "k1"}, {"queue": "k", "payload": 2}]}
    headers = {"Idempotency-Key": "answer-1"}
    first = await http.post("/api/v1/push", json=body, headers=headers)
    again = await http.post("/api/v1/push", json=body, headers=headers)
    assert first.status_code == again.status_code == 201
    assert again.content == first.content
    assert again.headers.get("idempotent-replayed") == "true" and "idempotent-replayed" not in first.headers
    got = first.json()
    homes = [NewMessage("k", "Default", b"", "k1", None), NewMessage("k", "Default", b"", None, None)]
    rows = [(x["status"], uuid.UUID(x["messageId"]), int(x["partitionId"]), x["offset"]) for x in got]
    assert first.content == orjson.dumps(legacy_render(homes, rows))


async def test_a_binary_push_stored_as_is_answers_the_old_bytes(broker: Broker, http: httpx.AsyncClient) -> None:
    batches = [PushBatch("bq", "p1", [b"1", b"2"], ["b\\1", "b2"]), PushBatch("bq2", "Default", [b"3"], ["é"])]
    ctype = {"content-type": "application/x-queen-push"}
    r = await http.post("/api/v1/push", content=encode_push_frames(batches), headers=ctype)
    assert r.status_code == 201, r.text
    got = r.json()
    groups = [Group(b.queue, b.partition, list(b.transaction_ids or []), b.payloads) for b in batches]
    rows = [(x["status"], uuid.UUID(x["messageId"]), int(x["partitionId"]), x["offset"]) for x in got]
    assert r.content == orjson.dumps(legacy_binary_render(groups, rows))
    assert [x["transactionId"] for x in got] == ["b\\1", "b2", "é"]
    again = await http.post("/api/v1/push", content=encode_push_frames(batches, counts=True), headers=ctype)
    assert again.status_code == 201 and again.json() == {"count": 3, "queued": 0, "duplicate": 3, "error": None}
