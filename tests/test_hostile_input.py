"""Hostile input per route family: each case is a 4xx with a JSON ``error``, and nothing is
written (the database is queried); edge timestamps are accepted; a message whose transactionId could
not be acked cannot be created."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from tests.conftest import Broker
from tests.helpers import hot_client, push

BIG = 2**64  # one past what a 64-bit integer holds
BIG_JSON = str(2**70)
NUL = "a\x00b"
DEEP = b"[" * 5000 + b"]" * 5000  # deeper than Python's recursion limit
DEEP_OBJ = b'{"a":' * 5000 + b"1" + b"}" * 5000
DEEP_TIMER = b'{"op": "schedule", "queue": "q", "timerKey": "k", "txn": "t", "delayMs": 1000, "payload": "%s"}' % (
    base64.b64encode(DEEP)
)
EDGES = ("0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00")
JSON = {"content-type": "application/json"}


@pytest.fixture
async def http(broker: Broker) -> AsyncIterator[httpx.AsyncClient]:
    """The conftest client, also checking that the protocol answered every hot-route request (the tables
    run against the data plane as QUEEN_HOT_PROTOCOL=1 serves it)."""
    async with hot_client(broker) as client:
        yield client


TABLES = ("queues", "log_partitions", "log_segments", "log_txns", "log_dlq", "kv", "timers", "traces")


async def rows(conn: asyncpg.Connection) -> dict[str, int]:
    return {t: await conn.fetchval(f"SELECT count(*) FROM queen.{t}") for t in TABLES}


def refused(r: httpx.Response, *statuses: int) -> dict[str, Any]:
    assert r.status_code in (statuses or (400,)), (r.status_code, r.text)
    body: dict[str, Any] = r.json()
    assert isinstance(body.get("error"), str) and body["error"], body
    return body


# (method, path, raw JSON body or None, query params or None)
BODIES: list[tuple[str, bytes]] = [
    # integers beyond 64 bits and 1e999: a payload comes back exactly or is refused
    ("/api/v1/push", b'{"items": [{"queue": "q", "payload": ' + BIG_JSON.encode() + b"}]}"),
    ("/api/v1/push", b'{"items": [{"queue": "q", "payload": {"n": [1, ' + BIG_JSON.encode() + b"]}}]}"),
    ("/api/v1/push", b'{"items": [{"queue": "q", "payload": {"x": 1e999}}]}'),
    ("/api/v1/push", b'{"items": [{"queue": "q", "data": -' + BIG_JSON.encode() + b"}]}"),
    (
        "/api/v1/kv",
        b'{"operations": [{"op": "put", "ns": "n", "key": "k", "forever": true, "value": ' + BIG_JSON.encode() + b"}]}",
    ),
    ("/api/v1/kv", b'{"operations": [{"op": "put", "ns": "n", "key": "k", "forever": true, "value": 1e999}]}'),
    (
        "/api/v1/kv",
        b'{"operations": [{"op": "incr", "ns": "n", "key": "k", "forever": true, "delta": '
        + BIG_JSON.encode()
        + b"}]}",
    ),
    ("/api/v1/configure", b'{"queue": "q", "options": {"custom": ' + BIG_JSON.encode() + b"}}"),
    ("/api/v1/configure", b'{"queue": "q", "options": {"leaseTime": ' + BIG_JSON.encode() + b"}}"),
    ("/api/v1/traces", b'{"transactionId": "t", "partitionId": "1", "data": ' + BIG_JSON.encode() + b"}"),
    # NUL in text that reaches PostgreSQL
    ("/api/v1/push", b'{"items": [{"queue": "q", "payload": 1, "transactionId": "a\\u0000b"}]}'),
    ("/api/v1/push", b'{"items": [{"queue": "q\\u0000", "payload": 1}]}'),
    ("/api/v1/push", b'{"items": [{"queue": "q", "partition": "p\\u0000", "payload": 1}]}'),
    ("/api/v1/configure", b'{"queue": "q", "options": {"custom": "a\\u0000b"}}'),
    ("/api/v1/configure", b'{"queue": "q", "options": {"cu\\u0000stom": 1}}'),
    ("/api/v1/configure", b'{"queue": "q", "namespace": "n\\u0000"}'),
    ("/api/v1/ack", b'{"transactionId": "t", "partitionId": "1", "status": "failed", "error": "a\\u0000b"}'),
    ("/api/v1/ack", b'{"transactionId": "t\\u0000", "partitionId": "1"}'),
    ("/api/v1/ack", b'{"transactionId": "t", "partitionId": "1", "leaseId": "l\\u0000"}'),
    ("/api/v1/ack/batch", b'{"acknowledgments": [{"transactionId": "t", "partitionId": "1", "error": "\\u0000"}]}'),
    ("/api/v1/kv", b'{"operations": [{"op": "get", "ns": "n\\u0000", "key": "k"}]}'),
    ("/api/v1/locks", b'{"operations": [{"op": "acquire", "name": "a", "ttlSeconds": 5, "owner": "o\\u0000"}]}'),
    ("/api/v1/traces", b'{"transactionId": "t", "partitionId": "1", "eventType": "e\\u0000", "data": 1}'),
    # transactionIds a message could not be acked (or retried by path) with: control characters
    ("/api/v1/push", b'{"items": [{"queue": "q", "payload": 1, "transactionId": "a\\nb"}]}'),
    ("/api/v1/push", b'{"items": [{"queue": "q", "payload": 1, "transactionId": "a\\u007fb"}]}'),
    ("/api/v1/push", b'{"items": [{"queue": "q", "payload": 1, "transactionId": ""}]}'),
    # the one identifier rule (docs/wire.md#text): no C0, DEL or C1 anywhere, a final newline included
    ("/api/v1/push", b'{"items": [{"queue": "q", "payload": 1, "transactionId": "a\\u0085b"}]}'),
    ("/api/v1/push", b'{"items": [{"queue": "q", "payload": 1, "transactionId": "a\xc2\x9bb"}]}'),  # raw C1
    ("/api/v1/push", b'{"items": [{"queue": "q", "payload": 1, "transactionId": "abc\\n"}]}'),
    ("/api/v1/push", b'{"items": [{"queue": "q\\u007f", "payload": 1}]}'),
    ("/api/v1/push", b'{"items": [{"queue": "q\\u0085", "payload": 1}]}'),
    ("/api/v1/push", b'{"items": [{"queue": "q", "partition": "p\\u009f", "payload": 1}]}'),
    ("/api/v1/configure", b'{"queue": "q", "namespace": "n\\u007f"}'),
    ("/api/v1/ack", b'{"transactionId": "t\\tx", "partitionId": "1"}'),
    ("/api/v1/ack", b'{"transactionId": "t\\u007f", "partitionId": "1"}'),
    ("/api/v1/ack", b'{"transactionId": "t", "partitionId": "1", "leaseId": "l\\u0085"}'),
    ("/api/v1/ack/batch", b'{"acknowledgments": [{"transactionId": "t\\n", "partitionId": "1"}]}'),
    ("/api/v1/timers", b'{"operations": [{"op": "cancel", "queue": "q", "timerKey": "k", "txn": "t\\u0085"}]}'),
    ("/api/v1/timers", b'{"operations": [{"op": "cancel", "queue": "q", "timerKey": "k", "txn": "t\\n"}]}'),
    ("/api/v1/transaction", b'{"operations": [], "requiredLeases": ["l\\u007f"]}'),
    (
        "/api/v1/transaction",
        b'{"operations": [{"type": "push", "items": [{"queue": "q", "payload": 1, "transactionId": "\\u0085"}]}]}',
    ),
    # a QPF1 frame stores the transactionId length in a u16 (was a 500 in the encoder)
    ("/api/v1/push", b'{"items": [{"queue": "q", "payload": 1, "transactionId": "' + b"t" * 65536 + b'"}]}'),
    # configure options beyond their integer columns
    ("/api/v1/configure", b'{"queue": "q", "options": {"retentionSeconds": 1e20}}'),
    ("/api/v1/configure", b'{"queue": "q", "options": {"retentionSeconds": 100000000000000000000}}'),
    ("/api/v1/configure", b'{"queue": "q", "options": {"dedupWindowSeconds": 4611686018427387904}}'),
    ("/api/v1/configure", b'{"queue": "q", "options": {"delayedProcessing": 4611686018427387904}}'),
    ("/api/v1/configure", b'{"queue": "q", "options": {"priority": -2147483649}}'),
    # nesting past the decoder's recursion (msgspec raised RecursionError: a 500), at each family
    ("/api/v1/push", b'{"items": [{"queue": "q", "payload": ' + DEEP + b"}]}"),
    ("/api/v1/push", b'{"items": [{"queue": "q", "payload": ' + DEEP_OBJ + b"}]}"),
    ("/api/v1/ack", b'{"transactionId": "t", "partitionId": "1", "x": ' + DEEP + b"}"),
    ("/api/v1/ack/batch", b'{"acknowledgments": ' + DEEP + b"}"),
    ("/api/v1/configure", b'{"queue": "q", "options": {"custom": ' + DEEP + b"}}"),
    ("/api/v1/traces", b'{"transactionId": "t", "partitionId": "1", "data": ' + DEEP_OBJ + b"}"),
    ("/api/v1/kv", b'{"operations": [{"op": "put", "ns": "n", "key": "k", "forever": true, "value": ' + DEEP + b"}]}"),
    ("/api/v1/locks", b'{"operations": ' + DEEP + b"}"),
    ("/api/v1/timers", b'{"operations": [{"op": "schedule", "queue": "q", "x": ' + DEEP + b"}]}"),
    ("/api/v1/timers", b'{"operations": [' + DEEP_TIMER + b"]}"),
    ("/api/v1/transaction", b'{"operations": [{"type": "push", "items": [{"queue": "q", "payload": ' + DEEP + b"}]}]}"),
    ("/api/v1/transaction", b'{"operations": [], "timers": [' + DEEP_TIMER + b"]}"),
    ("/api/v1/system/maintenance", b'{"enabled": false, "x": ' + DEEP + b"}"),
    # transactions carry the same rules
    (
        "/api/v1/transaction",
        b'{"operations": [{"type": "push", "items": [{"queue": "q", "payload": ' + BIG_JSON.encode() + b"}]}]}",
    ),
    (
        "/api/v1/transaction",
        b'{"operations": [{"type": "push", "items": [{"queue": "q", "transactionId": "\\u0000"}]}]}',
    ),
    (
        "/api/v1/transaction",
        b'{"operations": [{"type": "ack", "transactionId": "t", "partitionId": "1", "leaseId": "\\u0000"}]}',
    ),
]


@pytest.mark.parametrize(("path", "raw"), BODIES, ids=[f"{i}:{p.rsplit('/', 1)[1]}" for i, (p, _) in enumerate(BODIES)])
async def test_hostile_bodies_are_4xx_and_write_nothing(
    http: httpx.AsyncClient, conn: asyncpg.Connection, path: str, raw: bytes
) -> None:
    before = await rows(conn)
    r = await http.post(path, content=raw, headers={"content-type": "application/json"})
    refused(r, 400, 413)
    assert await rows(conn) == before


async def test_configure_out_of_range_names_the_range(http: httpx.AsyncClient) -> None:
    for name, value in (("retentionSeconds", 10**20), ("dedupWindowSeconds", 2**62), ("delayedProcessing", 2**62)):
        body = refused(await http.post("/api/v1/configure", json={"queue": "q", "options": {name: value}}))
        assert f"options.{name} must be an integer from 0 to 2147483647" in body["error"], body
    ok = await http.post("/api/v1/configure", json={"queue": "q", "options": {"retentionSeconds": 2**31 - 1}})
    assert ok.status_code == 200, ok.text


QUERIES: list[tuple[str, dict[str, str]]] = [
    ("/api/v1/pop", {"namespace": "a\x00"}),
    ("/api/v1/pop", {"task": "a\x00"}),
    ("/api/v1/pop/queue/q", {"consumerGroup": "g\x00"}),
    ("/api/v1/resources/queues", {"search": "a\x00"}),
    ("/api/v1/resources/queues", {"namespace": "a\x00"}),
    ("/api/v1/traces/names", {"search": "a\x00"}),
    ("/api/v1/messages", {"queue": "q\x00"}),
    ("/api/v1/dlq", {"queue": "q\x00"}),
    ("/api/v1/dlq", {"to": ""}),
    ("/api/v1/dlq", {"from": ""}),
    ("/api/v1/traces/by-name/n", {"to": ""}),
    ("/api/v1/messages", {"queue": "q", "from": ""}),
    ("/api/v1/status/queues", {"to": ""}),
    ("/api/v1/pop/queue/q", {"batch": ""}),
    ("/api/v1/pop/queue/q", {"wait": "yes"}),
    ("/api/v1/pop/queue/q", {"timeout": "9" * 50}),
    ("/api/v1/pop/queue/q", {"subscriptionFrom": "2026-01-01T00:00:00"}),  # no zone
    ("/api/v1/pop/queue/q", {"subscriptionFrom": "20260101T000000Z"}),  # not RFC 3339
    ("/api/v1/resources/queues", {"limit": "1.5"}),
]


@pytest.mark.parametrize(("path", "query"), QUERIES, ids=[f"{i}" for i in range(len(QUERIES))])
async def test_hostile_query_parameters_are_400(
    http: httpx.AsyncClient, conn: asyncpg.Connection, path: str, query: dict[str, str]
) -> None:
    before = await rows(conn)
    refused(await http.get(path, params=query))
    assert await rows(conn) == before


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/messages/1/a%00b",
        "/api/v1/traces/1/a%00b",
        "/api/v1/status/queues/a%00b",
        "/api/v1/consumer-groups/g%00",
        "/api/v1/resources/queues/q%00",
    ],
)
async def test_nul_in_paths_is_400(http: httpx.AsyncClient, path: str) -> None:
    refused(await http.get(path))


@pytest.mark.parametrize("name", ["a%00b", "x" * 300, "vendor/" + "y" * 5000])
async def test_an_impossible_dashboard_file_name_is_404(http: httpx.AsyncClient, name: str) -> None:
    """A NUL (ValueError) or a name past NAME_MAX (OSError ENAMETOOLONG) was a 500 from Path.resolve."""
    refused(await http.get(f"/dashboard/{name}"), 404)


async def test_nul_in_lease_and_retry_paths_is_400(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    before = await rows(conn)
    refused(await http.post("/api/v1/lease/l%00/extend"))
    refused(await http.post("/api/v1/messages/1/a%00b/retry"))
    refused(await http.delete("/api/v1/messages/1/a%00b"))
    assert await rows(conn) == before


@pytest.mark.parametrize("char", ["%09", "%7F", "%C2%85"])  # TAB, DEL, C1: once only NUL was refused here
async def test_control_characters_in_id_paths_are_400_and_write_nothing(
    http: httpx.AsyncClient, conn: asyncpg.Connection, char: str
) -> None:
    await push(http, "q", [{"payload": 1, "transactionId": "t1"}])
    before = await rows(conn)
    refused(await http.post(f"/api/v1/lease/l{char}/extend"))
    refused(await http.get(f"/api/v1/messages/1/a{char}b"))
    refused(await http.post(f"/api/v1/messages/1/a{char}b/retry"))
    refused(await http.post(f"/api/v1/messages/1/a{char}b/dlq"))
    refused(await http.delete(f"/api/v1/messages/1/a{char}b"))
    refused(await http.get(f"/api/v1/pop/queue/q{char}"))
    refused(await http.get("/api/v1/pop/queue/q", params={"consumerGroup": "g\x85"}))
    refused(await http.delete(f"/api/v1/timers/q/k?txn=t{char}"))
    assert await rows(conn) == before


@pytest.mark.parametrize("ts", EDGES)
async def test_edge_timestamps_are_accepted(http: httpx.AsyncClient, ts: str) -> None:
    await push(http, "q", [{"payload": 1, "transactionId": "t1"}])
    pop = await http.get(
        "/api/v1/pop/queue/q", params={"consumerGroup": "g", "subscriptionMode": "from", "subscriptionFrom": ts}
    )
    assert pop.status_code in (200, 204), pop.text
    if ts.startswith("0001"):  # before everything: the message is read
        assert pop.status_code == 200 and pop.json()["messages"][0]["transactionId"] == "t1"
    for path, params in (
        ("/api/v1/messages", {"queue": "q", "from": ts}),
        ("/api/v1/messages", {"queue": "q", "to": ts}),
        ("/api/v1/dlq", {"from": ts, "to": ts}),
        ("/api/v1/traces/by-name/n", {"from": ts}),
        ("/api/v1/status/queues", {"from": ts}),
        ("/api/v1/status/analytics", {"to": ts, "interval": "day"}),
    ):
        r = await http.get(path, params=params)
        assert r.status_code == 200, (path, params, r.text)
    seek = await http.post("/api/v1/consumer-groups/g/queues/q/seek", json={"timestamp": ts})
    assert seek.status_code == 200, seek.text
    sub = await http.post("/api/v1/consumer-groups/g/subscription", json={"subscriptionTimestamp": ts})
    assert sub.status_code == 200, sub.text
    listed = (await http.get("/api/v1/messages", params={"queue": "q", "from": EDGES[0], "to": EDGES[1]})).json()
    assert [m["transactionId"] for m in listed["messages"]] == ["t1"]


async def test_a_refused_transaction_id_leaves_no_message_and_an_accepted_one_acks(
    http: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    for txn in ("a\x00b", "a\x01b", "tab\there", "a\x7f", "a\x85", "\x9b[31m", "trailing\n"):
        refused(await http.post("/api/v1/push", json={"items": [{"queue": "q", "payload": 1, "transactionId": txn}]}))
    assert await rows(conn) == dict.fromkeys(TABLES, 0)
    odd = "ünïcødé/with spaces & ?#"
    await push(http, "q", [{"payload": 1, "transactionId": odd}])
    (m,) = (await http.get("/api/v1/pop/queue/q")).json()["messages"]
    ack = await http.post(
        "/api/v1/ack",
        json={"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]},
    )
    assert ack.status_code == 200 and ack.json()[0]["success"] is True, ack.text


async def test_payloads_round_trip_exactly_at_the_64_bit_edges(http: httpx.AsyncClient) -> None:
    payload = {"max": 2**64 - 1, "min": -(2**63), "f": 1.5e300, "s": "\\u0000 is text here", "nul": "a\x00b"}
    await push(http, "q", [{"payload": payload}])
    (m,) = (await http.get("/api/v1/pop/queue/q")).json()["messages"]
    assert m["data"] == payload


async def test_an_integral_float_is_an_integer_and_a_fraction_is_refused(http: httpx.AsyncClient) -> None:
    """JSON Schema's rule: 5.0 is an integer."""
    ok = await http.post("/api/v1/configure", content=b'{"queue": "q", "options": {"leaseTime": 60.0}}', headers=JSON)
    assert ok.status_code == 200 and ok.json()["options"]["leaseTime"] == 60, ok.text
    refused(
        await http.post("/api/v1/configure", content=b'{"queue": "q", "options": {"leaseTime": 60.5}}', headers=JSON)
    )


async def test_inverted_and_wide_windows_are_answered(http: httpx.AsyncClient) -> None:
    r = await http.get(
        "/api/v1/status/analytics", params={"from": "2020-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}
    )
    assert r.status_code == 200, r.text
    assert r.json()["from"].startswith("2025-12-25")  # cut to the 10080 minutes ending at `to`
    r = await http.get(
        "/api/v1/status/analytics", params={"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"}
    )
    assert r.status_code == 200 and r.json()["series"] == [], r.text


async def test_an_oversized_batch_is_served_at_the_largest_batch(start_broker: Any) -> None:
    b = await start_broker(max_batch=2)
    async with httpx.AsyncClient(base_url=b.url) as client:
        await push(client, "q", [{"payload": i} for i in range(5)])
        r = await client.get("/api/v1/pop/queue/q", params={"batch": 10_000_000})
        assert r.status_code == 200 and len(r.json()["messages"]) == 2, r.text
