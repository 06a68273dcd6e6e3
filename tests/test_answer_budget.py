"""The answer budget (QUEEN_MAX_ANSWER_BYTES): a small request must not buy a large answer.

Real broker, real HTTP, a low budget. A /kv batch that would answer more than the budget is 413
``answer_too_large`` (nothing written), and so is a transaction whose KV reads would (none of its acks,
pushes, KV writes or timers is committed); the paged reads (KV browse, messages, DLQ, traces) stop
their page at the budget and say where the next one starts. The worker never receives from
PostgreSQL a result much larger than the budget: a spy on the pool (it only measures what the real
calls return) records the largest one.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import orjson
import pytest
from queen import Queen
from queen.http.push_binary import PushBatch, encode_transaction_frames

from queen_pg.db.pool import Database
from tests.conftest import Broker
from tests.helpers import pop, push
from tests.test_security_jwt import JWT_ON, bearer, token
from tests.test_transaction import ack_op, push_op, timer_op
from tests.test_transaction import state as tx_state

BUDGET = 256 * 1024
ITEM = 40_000  # bytes of one payload / value / trace: the budget holds six of them
SLACK = 2 * ITEM  # an answer may pass the budget by the one item that crossed it, plus its envelope


def blob(n: int = ITEM) -> str:
    """Incompressible text (hex) of ``n`` characters: zstd cannot hide it."""
    return secrets.token_hex(n // 2)


def measure(value: Any) -> int:
    if isinstance(value, bytes | bytearray | memoryview | str):
        return len(value)
    if isinstance(value, list | tuple):
        return sum(measure(v) for v in value)
    if hasattr(value, "values"):  # an asyncpg Record
        return sum(measure(v) for v in value.values())
    return 0


class Spy:
    """The largest result (bytes of its text and bytea values) one pool call handed the broker."""

    def __init__(self) -> None:
        self.largest = 0

    def reset(self) -> None:
        self.largest = 0


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Spy]:
    s = Spy()
    real_fetch, real_fetchval = Database.fetch, Database.fetchval

    async def fetch(self: Database, sql: str, *args: Any) -> Any:
        rows = await real_fetch(self, sql, *args)
        s.largest = max(s.largest, measure(rows))
        return rows

    async def fetchval(self: Database, sql: str, *args: Any) -> Any:
        value = await real_fetchval(self, sql, *args)
        s.largest = max(s.largest, measure(value))
        return value

    monkeypatch.setattr(Database, "fetch", fetch)
    monkeypatch.setattr(Database, "fetchval", fetchval)
    yield s


@pytest.fixture
async def broker(start_broker: Any) -> Broker:
    b: Broker = await start_broker(max_answer_bytes=BUDGET, jobs_enabled=False)  # no dlq_fill: segments decoded
    return b


@pytest.fixture
async def jwt_broker(start_broker: Any) -> Broker:
    b: Broker = await start_broker(max_answer_bytes=BUDGET, **JWT_ON)
    return b


async def kv(http: httpx.AsyncClient, ops: list[dict[str, Any]], headers: dict[str, str] | None = None) -> Any:
    return await http.post("/api/v1/kv", json={"operations": ops}, headers=headers)


def assert_too_large(r: httpx.Response) -> None:
    assert r.status_code == 413, r.text[:300]
    body = r.json()
    assert body["code"] == "answer_too_large" and body["error"] == "answer_too_large", body
    assert str(BUDGET) in body["detail"] and "QUEEN_MAX_ANSWER_BYTES" in body["detail"], body


# --- KV: /kv batches (no paging: 413) and the browse route (paged) ---------------------------------


async def test_64_identical_get_prefix_from_a_read_only_token_is_413_not_megabytes(
    jwt_broker: Broker, spy: Spy
) -> None:
    rw, ro = bearer(token("read-write")), bearer(token("read-only"))
    async with httpx.AsyncClient(base_url=jwt_broker.url, timeout=60) as http:
        values = {f"p/{i}": blob() for i in range(4)}  # 160 KB: one getPrefix fits the budget
        r = await kv(
            http, [{"op": "put", "ns": "n", "key": k, "value": v, "forever": True} for k, v in values.items()], rw
        )
        assert r.status_code == 200, r.text

        one = await kv(http, [{"op": "getPrefix", "ns": "n", "prefix": "p/", "limit": 1000}], ro)
        assert one.status_code == 200  # the legitimate read is unchanged
        (res,) = one.json()["results"]
        assert {row["key"]: row["value"] for row in res["rows"]} == values
        assert res["truncated"] is False and res["nextAfter"] is None

        spy.reset()
        attack = [{"op": "getPrefix", "ns": "n", "prefix": "p/", "limit": 1000}] * 64
        r = await kv(http, attack, ro)
        assert_too_large(r)
        assert len(r.content) < 1000
        # the procedure stopped within the first ops (the 2nd getPrefix page stops early at what is
        # left, the 3rd passes the budget), it did not read the other 61
        assert "operations[0..2] passes" in r.json()["detail"]
        assert spy.largest <= BUDGET + SLACK, spy.largest  # PostgreSQL stopped: 64 x 160 KB never reached us


async def test_kv_batches_over_the_budget_are_413_and_write_nothing(http: httpx.AsyncClient, spy: Spy) -> None:
    value = blob()
    keys = [f"k{i}" for i in range(10)]
    r = await kv(http, [{"op": "put", "ns": "m", "key": k, "value": value, "forever": True} for k in keys])
    assert r.status_code == 200, r.text  # 400 KB of applied puts: their echo is the request's own bytes
    spy.reset()
    for ops in (
        [{"op": "getMany", "ns": "m", "keys": keys}],  # 400 KB in one op
        [{"op": "get", "ns": "m", "key": "k0"}] * 10,  # one key, ten times
        [{"op": "check", "ns": "m", "key": "k0", "expect": 0}] * 10,  # a lost check answers the value too
    ):
        assert_too_large(await kv(http, ops))
    assert spy.largest <= BUDGET + SLACK, spy.largest
    # a write in a refused batch is rolled back
    refused = [
        {"op": "put", "ns": "m", "key": "new", "value": 1, "forever": True},
        *[{"op": "get", "ns": "m", "key": "k1"}] * 10,
    ]
    assert_too_large(await kv(http, refused))
    r = await kv(http, [{"op": "get", "ns": "m", "key": "new"}])
    assert r.json()["results"][0]["found"] is False
    # what fits is answered as before
    r = await kv(http, [{"op": "getMany", "ns": "m", "keys": keys[:3]}, {"op": "get", "ns": "m", "key": "k3"}])
    assert r.status_code == 200
    many, single = r.json()["results"]
    assert [row["key"] for row in many["rows"]] == keys[:3] and many["missing"] == []
    assert single["found"] is True and single["value"] == value


async def test_a_get_prefix_page_stops_at_the_budget_and_pages_on(http: httpx.AsyncClient) -> None:
    values = {f"q/{i:02}": blob() for i in range(12)}  # 480 KB
    for k, v in values.items():
        assert (await kv(http, [{"op": "put", "ns": "b", "key": k, "value": v, "forever": True}])).status_code == 200
    seen: dict[str, str] = {}
    after: str | None = None
    pages = 0
    while True:
        op: dict[str, Any] = {"op": "getPrefix", "ns": "b", "prefix": "q/", "limit": 1000}
        if after is not None:
            op["after"] = after
        r = await kv(http, [op])
        assert r.status_code == 200, r.text
        assert len(r.content) <= BUDGET + SLACK
        (res,) = r.json()["results"]
        assert res["rows"], "every page makes progress"
        seen.update({row["key"]: row["value"] for row in res["rows"]})
        pages += 1
        if not res["truncated"]:
            assert res["nextAfter"] is None
            break
        assert res["nextAfter"] == res["rows"][-1]["key"]
        after = res["nextAfter"]
    assert seen == values and pages >= 2


async def test_kv_browse_pages_stop_at_the_budget(http: httpx.AsyncClient, spy: Spy) -> None:
    values = {f"key-{i:02}": blob() for i in range(12)}
    for k, v in values.items():
        assert (await kv(http, [{"op": "put", "ns": "w", "key": k, "value": v, "forever": True}])).status_code == 200
    spy.reset()
    seen: dict[str, str] = {}
    params: dict[str, Any] = {"ns": "w", "limit": 1000}
    while True:
        r = await http.get("/api/v1/kv/keys", params=params)
        assert r.status_code == 200 and len(r.content) <= BUDGET + SLACK
        page = r.json()
        assert page["rows"]
        seen.update({row["key"]: row["value"] for row in page["rows"]})
        if not page["truncated"]:
            break
        params["after"] = page["nextAfter"]
    assert seen == values
    assert spy.largest <= BUDGET + SLACK
    small = (await http.get("/api/v1/kv/keys", params={"ns": "w", "limit": 2})).json()
    assert [row["key"] for row in small["rows"]] == ["key-00", "key-01"] and small["nextAfter"] == "key-01"
    assert set(small) == {"prefix", "rows", "truncated", "nextAfter"}


# --- timers: the list is a keyset page like KV browse ----------------------------------------------


async def test_timer_list_pages_stop_at_the_budget(jwt_broker: Broker, spy: Spy) -> None:
    """A timer's txn may be 64 KiB: a 1000-row page of a read-only token was tens of MB with
    truncated false. It stops at the budget, says where to go on, and the walk sees each timer once."""
    rw, ro = bearer(token("read-write")), bearer(token("read-only"))
    txns = {f"t-{i:02}": f"{i:02}-" + blob() for i in range(20)}  # 20 x 40 KB of txn: 3 budgets
    async with httpx.AsyncClient(base_url=jwt_broker.url, timeout=60) as http:
        ops = [timer_op("tl", key, {"big": blob()}, 3_600_000, txn) for key, txn in txns.items()]
        r = await http.post("/api/v1/timers", json={"operations": ops}, headers=rw)
        assert r.status_code == 200 and all(res["ok"] for res in r.json()["results"]), r.text[:300]
        spy.reset()
        seen: list[str] = []
        params: dict[str, Any] = {"limit": 1000}
        pages = 0
        while True:
            r = await http.get("/api/v1/timers/tl", params=params, headers=ro)
            assert r.status_code == 200, r.text[:300]
            assert len(r.content) <= BUDGET + SLACK, len(r.content)
            page = r.json()
            assert set(page) == {"rows", "truncated", "nextAfter"}
            assert page["rows"], "every page makes progress"
            for row in page["rows"]:
                assert set(row) == {"timerKey", "txn", "deliverAt", "messageId", "partition"}
                assert row["txn"] == txns[row["timerKey"]]
            seen += [row["timerKey"] for row in page["rows"]]
            pages += 1
            if not page["truncated"]:
                assert page["nextAfter"] is None
                break
            assert page["nextAfter"] == page["rows"][-1]["timerKey"]
            params["after"] = page["nextAfter"]
        assert seen == sorted(txns), "each timer exactly once, in key order"
        assert pages >= 3
        assert spy.largest <= BUDGET + SLACK, spy.largest  # PostgreSQL stopped reading at the budget
        # a short page is cut by its limit, as before
        small = (await http.get("/api/v1/timers/tl", params={"limit": 2}, headers=ro)).json()
        assert [row["timerKey"] for row in small["rows"]] == ["t-00", "t-01"] and small["nextAfter"] == "t-01"
        # a peek gives the payload once (as JSON), not again as base64
        payload = {"big": blob()}
        ops = [timer_op("tl", "one", payload, 3_600_000, "one-txn")]
        assert (await http.post("/api/v1/timers", json={"operations": ops}, headers=rw)).status_code == 200
        r = await http.get("/api/v1/timers/tl/one", headers=ro)
        assert r.json()["data"] == payload and "payload" not in r.json()
        assert len(r.content) < len(orjson.dumps(payload)) + 1000, len(r.content)
    # the official client walks the pages
    async with Queen(jwt_broker.url, bearer_token=token("read-only")) as client:
        rows = await client.timers.list_all("tl", limit=1000)
        assert [row["timerKey"] for row in rows] == sorted([*txns, "one"])


# --- messages, DLQ, traces: limit/offset pages stop early with nextOffset ---------------------------


async def walk(http: httpx.AsyncClient, path: str, key: str, **params: Any) -> list[dict[str, Any]]:
    """Every item of a limit/offset listing, following nextOffset when a page stops at the budget."""
    items: list[dict[str, Any]] = []
    offset, cut = 0, 0
    while True:
        r = await http.get(path, params={**params, "limit": 100, "offset": offset})
        assert r.status_code == 200, r.text
        assert len(r.content) <= BUDGET + SLACK, len(r.content)
        page = r.json()
        items += page[key]
        if not page.get("truncated"):
            assert "nextOffset" not in page
            assert offset + len(page[key]) == page["total"]
            break
        cut += 1
        assert page[key], "every page makes progress"
        assert page["nextOffset"] == offset + len(page[key]) < page["total"]
        offset = page["nextOffset"]
    assert cut >= 1, "a page stopped at the budget"
    return items


@pytest.mark.parametrize("one_push", [False, True], ids=["a-segment-each", "one-zstd-segment"])
async def test_message_browse_pages_stop_at_the_budget(http: httpx.AsyncClient, spy: Spy, one_push: bool) -> None:
    """One segment per message (the procedure stops handing out segments) and one segment of very
    compressible messages (the broker stops decoding)."""
    data = {f"t{i:02}": ("x" * ITEM if one_push else blob()) + str(i) for i in range(12)}
    items = [{"payload": {"d": d}, "transactionId": t} for t, d in data.items()]
    if one_push:
        await push(http, "mq", items)
    else:
        for it in items:
            await push(http, "mq", [it])
    spy.reset()
    got = await walk(http, "/api/v1/messages", "messages", queue="mq", order="asc")
    assert [(m["transactionId"], m["data"]["d"]) for m in got] == list(data.items())
    assert spy.largest <= BUDGET + SLACK, spy.largest
    small = (await http.get("/api/v1/messages", params={"queue": "mq", "limit": 2, "order": "asc"})).json()
    assert len(small["messages"]) == 2 and "truncated" not in small and "nextOffset" not in small
    detail = await http.get(f"/api/v1/messages/{got[0]['partitionId']}/t00")
    assert detail.status_code == 200 and detail.json()["data"] == {"d": data["t00"]}


async def test_dlq_pages_stop_at_the_budget(http: httpx.AsyncClient, spy: Spy) -> None:
    data = {f"d{i:02}": blob() for i in range(12)}
    for t, d in data.items():
        await push(http, "dq", [{"payload": d, "transactionId": t}])
    msgs: list[dict[str, Any]] = []
    while len(msgs) < 12:  # a pop may stop at fewer than its batch
        got = await pop(http, "dq", consumerGroup="g", batch=100, wait=False)
        assert got, f"only {len(msgs)} of 12 popped"
        msgs += got["messages"] if isinstance(got, dict) else got
    for m in msgs:
        body = {
            "transactionId": m["transactionId"],
            "partitionId": m["partitionId"],
            "leaseId": m["leaseId"],
            "status": "dlq",
            "consumerGroup": "g",
        }
        r = await http.post("/api/v1/ack", json=body)
        assert r.status_code == 200 and r.json()[0]["dlq"] is True, r.text
    spy.reset()
    got = await walk(http, "/api/v1/dlq", "messages", queue="dq")
    assert sorted((m["transactionId"], m["data"]) for m in got) == sorted(data.items())
    assert spy.largest <= BUDGET + SLACK, spy.largest


async def test_trace_pages_stop_at_the_budget(http: httpx.AsyncClient, spy: Spy) -> None:
    pid = (await push(http, "tq", [{"payload": 1, "transactionId": "m"}]))[0]["partitionId"]
    data = [blob() for _ in range(12)]
    for d in data:
        body = {"transactionId": "m", "partitionId": pid, "traceNames": ["big"], "data": d}
        assert (await http.post("/api/v1/traces", json=body)).status_code == 201
    spy.reset()
    timeline = await walk(http, f"/api/v1/traces/{pid}/m", "traces")
    assert [t["data"] for t in timeline] == data  # oldest first
    named = await walk(http, "/api/v1/traces/by-name/big", "traces")
    assert [t["data"] for t in named] == data[::-1]  # newest first
    assert spy.largest <= BUDGET + SLACK, spy.largest


# --- /transaction: its KV reads share the budget; a refused transaction writes nothing ----------------


def assert_tx_too_large(r: httpx.Response) -> str:
    """413 in the house envelope (the KV family's has the code as ``error``): the message names the budget."""
    assert r.status_code == 413, r.text[:300]
    body = r.json()
    assert set(body) == {"error", "code"} and body["code"] == "answer_too_large", body
    assert str(BUDGET) in body["error"] and "QUEEN_MAX_ANSWER_BYTES" in body["error"], body
    return str(body["error"])


def step(m: dict[str, Any], reads: list[dict[str, Any]]) -> dict[str, Any]:
    """A worker's step: ack the popped message, push a result, write a key, schedule a timer, and read."""
    return {
        "operations": [
            {**ack_op(m), "consumerGroup": "w"},
            push_op("out", "out-1", {"done": 1}),
        ],
        "requiredLeases": [m["leaseId"]],
        "kv": [{"op": "put", "ns": "m", "key": "new", "value": 1, "forever": True}, *reads],
        "timers": [timer_op("later", "t-1", {"later": 1}, 86_400_000, "later-1")],
    }


async def test_a_transaction_whose_kv_reads_pass_the_budget_is_413_and_writes_nothing(
    http: httpx.AsyncClient, conn: asyncpg.Connection, spy: Spy
) -> None:
    value = blob()
    keys = [f"k{i}" for i in range(10)]
    r = await kv(http, [{"op": "put", "ns": "m", "key": k, "value": value, "forever": True} for k in keys])
    assert r.status_code == 200, r.text
    await push(http, "in", [{"payload": 1, "transactionId": "job"}])
    (m,) = (await pop(http, "in", consumerGroup="w"))["messages"]
    before = await tx_state(conn)
    spy.reset()
    for reads, last in (
        ([{"op": "getMany", "ns": "m", "keys": keys}], 1),  # 400 KB in one op
        ([{"op": "get", "ns": "m", "key": "k0"}] * 10, 7),  # one key, ten times: the 7th get passes 256 KiB
    ):
        r = await http.post("/api/v1/transaction", json=step(m, reads))
        assert f"kv[0..{last}] passes" in assert_tx_too_large(r)  # it stopped there, read no further
        # under a request key (the outcome window's procedure) too: refused, and nothing recorded
        keyed = await http.post("/api/v1/transaction", json=step(m, reads), headers={"Idempotency-Key": "step-1"})
        assert f"kv[0..{last}] passes" in assert_tx_too_large(keyed)
    assert spy.largest <= BUDGET + SLACK, spy.largest  # PostgreSQL stopped reading at the budget
    assert await tx_state(conn) == before  # no ack, push, KV write or timer of the refused steps

    # the binary body (QTB1): its framed pushes are not written either
    head = orjson.dumps({"kv": [{"op": "getMany", "ns": "m", "keys": keys}]})
    framed = encode_transaction_frames(head, [PushBatch("out", "Default", [b'{"done":2}'], ["out-2"])])
    r = await http.post("/api/v1/transaction", content=framed, headers={"Content-Type": "application/x-queen-push"})
    assert "kv[0..0] passes" in assert_tx_too_large(r)
    assert await tx_state(conn) == before

    # what fits is committed as before (the key the refusals used was not recorded: no replay, no reuse)
    small = step(m, [{"op": "getMany", "ns": "m", "keys": keys[:3]}, {"op": "get", "ns": "m", "key": "k3"}])
    r = await http.post("/api/v1/transaction", json=small, headers={"Idempotency-Key": "step-1"})
    assert r.status_code == 200, r.text
    res = r.json()
    assert res["success"] is True and r.headers.get("Idempotent-Replayed") != "true"
    ack, pushed, put, many, single, timer = res["results"]
    assert ack["success"] is True and ack["noop"] is False  # the refused steps did not commit it
    assert pushed["status"] == "queued" and put["applied"] is True and timer["status"] == "scheduled"
    assert [row["key"] for row in many["rows"]] == keys[:3] and many["missing"] == []
    assert single["found"] is True and single["value"] == value
    after = await tx_state(conn)
    assert after["messages"] == before["messages"] + 1 and after["timers"] == before["timers"] + 1
    assert [row[2] for row in after["kv"] if row[1] == "new"] == ["1"] and len(after["kv"]) == len(before["kv"]) + 1
