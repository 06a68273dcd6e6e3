"""The ack answer rendered straight from the call's verdicts (``ack_engine.AckResults``) is byte for
byte what ``orjson.dumps`` of the per-item dicts wrote before, and counts the same acks."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import orjson
import pytest

from queen_pg.api.shared.items import AckItem
from queen_pg.engine import ack as ack_engine
from queen_pg.engine.ack import AckResults, _Verdicts
from tests.helpers import pop, push
from tests.test_metrics import scrape, value

# transactionIds JSON must escape, or orjson writes in its own way (non-ASCII kept, "/" not escaped)
TXNS = ["t0", 'q"uote', "back\\slash", "tab\tnl\n\x01\x1f", "é😀ü", "a/b", "</script>", "\u2028\u2029", ""]


def _items(statuses: list[str]) -> list[AckItem]:
    return [AckItem(TXNS[i % len(TXNS)] + str(i), str(i % 3), s, None, None, None) for i, s in enumerate(statuses)]


def _dicts(v: _Verdicts, start: int, stop: int) -> list[dict[str, Any]]:
    """The answer as ack_many built it before (one dict per item, index from the request's start)."""
    return [
        {
            "index": i - start,
            "transactionId": v.items[i].transaction_id,
            "success": i not in v.errors,
            "error": v.errors.get(i),
            "leaseReleased": i in v.released,
            "dlq": i in v.dead,
            "noop": i in v.noop,
        }
        for i in range(start, stop)
    ]


def _counted(items: list[AckItem], results: list[dict[str, Any]], start: int) -> dict[str, int]:
    """Metrics.count_ack's loop over the dicts."""
    per: dict[str, int] = {}
    for r in results:
        if r["success"] and not r["noop"]:
            s = ack_engine.STATUSES[items[start + r["index"]].status]
            per[s] = per.get(s, 0) + 1
    return per


CASES = {
    "all applied": {},
    "refused": {"errors": {1: "lease is not held", 4: 'unknown partitionId "x\\y"'}},
    "released": {"released": {2, 8}},
    "dlq": {"dead": {3}},
    "noop": {"noop": {0, 5}},
    "mixed": {"errors": {7: "é"}, "released": {7, 9}, "dead": {1}, "noop": {2}},
}


@pytest.mark.parametrize("case", CASES)
def test_rendered_bytes_equal_orjson_of_the_dicts(case: str) -> None:
    statuses = [
        s for s, _ in zip(itertools.cycle(["completed", "success", "failed", "retry", "dlq"]), range(12), strict=False)
    ]
    items = _items(statuses)
    v = _Verdicts(items)
    for name, got in CASES[case].items():
        target = getattr(v, name)
        target.update(got)
    # one request alone, and the same call split into fused requests (each indexed from 0)
    for start, stop in [(0, 12), (0, 5), (5, 6), (6, 12), (12, 12)]:
        res = AckResults(v, start, stop)
        want = _dicts(v, start, stop)
        assert res.body() == orjson.dumps(want), (case, start, stop)
        assert list(res) == want and res == want and len(res) == stop - start
        assert res.applied() == _counted(items, want, start)
        if want:
            assert res[-1] == want[-1] and res[0:2] == want[0:2]


def test_rows_results_render_and_count_as_their_dicts() -> None:
    rows = [{"index": 0, "transactionId": "a", "success": True, "error": None, "leaseReleased": True, "dlq": False,
             "noop": False}]  # fmt: skip
    res = AckResults.of(rows)
    assert res.body() == orjson.dumps(rows) and list(res) == rows
    assert res.applied() is None  # counted from the dicts by Metrics.count_ack


async def test_http_answers_are_the_dicts_bytes_and_count_applied_acks(http: httpx.AsyncClient) -> None:
    await push(http, "q", [{"payload": i, "transactionId": f't{i}/é"{i}'} for i in range(5)])
    ms = (await pop(http, "q", batch=5))["messages"]
    acks: list[dict[str, Any]] = [
        {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]} for m in ms[:3]
    ]
    acks.append({"transactionId": "ghost", "partitionId": "no-such", "leaseId": ms[0]["leaseId"]})  # refused early
    acks.append({"transactionId": "x", "partitionId": ms[0]["partitionId"], "leaseId": "not-a-uuid"})  # refused early
    r = await http.post("/api/v1/ack/batch", json={"acknowledgments": acks})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    got = r.json()
    assert r.content == orjson.dumps(got)  # the dicts' bytes exactly (orjson's escaping and key order)
    assert [g["index"] for g in got] == [0, 1, 2, 3, 4]
    assert [g["success"] for g in got] == [True, True, True, False, False]
    assert got[3]["error"] == "unknown partitionId 'no-such'"
    assert got[4]["error"] == "lease is not held (unknown leaseId)"
    assert list(got[0]) == ["index", "transactionId", "success", "error", "leaseReleased", "dlq", "noop"]
    # the same acks again: each answered noop (already committed), counted once in all
    again = (await http.post("/api/v1/ack/batch", json={"acknowledgments": acks[:3]})).json()
    assert [g["noop"] for g in again] == [True, True, True]
    m = await scrape(http)
    assert value(m, "queen_messages_acked_total", tenant="default", status="completed") == 3


def test_packed_arguments_are_the_items_fixed_records_texts_and_errors() -> None:
    """ack_v3's p_items/p_txns/p_errors, built in one pass by Packed.args, as the format says."""
    import struct
    import uuid

    import xxhash

    lease = uuid.uuid4()
    rows = [(7, "a", lease, "g", "completed", None), (7, "日本", lease, "g", "completed", "x"),
            (8, "", None, "__QUEUE_MODE__", "failed", None), (7, 'q"', lease, "g", "completed", None)]  # fmt: skip
    p = ack_engine.Packed()
    for r in rows:
        p.add(*r)
    items, pids, groups, leases, statuses, txns, errors = p.args()
    want, at = b"", 0
    for pid, txn, _lease, _group, _status, _err in rows:
        raw = txn.encode()
        want += struct.pack("<16sHII", xxhash.xxh3_128_digest(raw), 1 if pid == 7 else 2, at, len(raw))
        at += len(raw)
    assert items == want and txns == 'a日本q"'.encode()
    assert (pids, groups, leases, statuses) == ([7, 8], ["g", "__QUEUE_MODE__"], [lease, None], ["completed", "failed"])
    assert errors == [None, "x", None, None]
    arrays = p.arrays()
    assert [str(u) for u in arrays[1]] == [
        str(uuid.UUID(bytes=xxhash.xxh3_128_digest(t.encode()))) for _, t, *_ in rows
    ]
    assert arrays[6] == [None, "x", None, None] and arrays[0] == [7, 7, 8, 7]
    clean = ack_engine.Packed()
    clean.add(*rows[0][:5], None)
    assert clean.args()[6] is None  # no error text at all: NULL
