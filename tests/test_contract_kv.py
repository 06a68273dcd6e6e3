"""The KV namespace rule (docs/wire.md#kv-namespaces: lowercase letters, digits, '-', '_', '.', ':', starting
with a letter or digit, at most 128 bytes) at every KV entry point (/kv and the transaction's kv rider), and the
reserved namespace queen-locks: readable, not writable through /kv. Official client where it can say it."""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
import pytest
from queen import Queen
from queen.errors import KvError

from tests.conftest import Broker
from tests.helpers import pop, push

GOOD = ["orders", "test-kv-py", "queen-locks", "a.b:c_d-1", "9lives", "x" * 128]
BAD = ["NOT A NAMESPACE", "Orders", "-x", ".x", "_x", ":x", "a b", "a/b", "caf\u00e9", "x" * 129, "a\tb", "a%b"]


def put(ns: str) -> dict[str, Any]:
    return {"op": "put", "ns": ns, "key": "k", "value": 1, "forever": True}


@pytest.mark.parametrize("ns", BAD)
async def test_a_bad_namespace_is_a_400_kv_bad_request_and_writes_nothing(
    http: httpx.AsyncClient, conn: asyncpg.Connection, ns: str
) -> None:
    for op in (put(ns), {"op": "get", "ns": ns, "key": "k"}, {"op": "getPrefix", "ns": ns, "prefix": ""}):
        # a good op first: the whole batch is refused
        r = await http.post("/api/v1/kv", json={"operations": [put("fine"), op]})
        assert r.status_code == 400, (ns, op, r.text)
        body = r.json()
        assert body["error"] and body["code"] == "kv_bad_request", body
        assert body["reason"] in ("bad_namespace", "too_long", "bad_field"), body  # control chars: bad_field
    assert await conn.fetchval("SELECT count(*) FROM queen.kv") == 0


@pytest.mark.parametrize("ns", [n for n in GOOD if n != "queen-locks"])
async def test_good_namespaces_pass(http: httpx.AsyncClient, ns: str) -> None:
    r = await http.post("/api/v1/kv", json={"operations": [put(ns), {"op": "get", "ns": ns, "key": "k"}]})
    assert r.status_code == 200, r.text
    wrote, got = r.json()["results"]
    assert wrote["applied"] is True and got["found"] is True and got["value"] == 1


async def test_queen_locks_is_readable_not_writable(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    lock = await http.post("/api/v1/locks", json={"operations": [{"op": "acquire", "name": "job", "ttlSeconds": 60}]})
    assert lock.status_code == 200 and lock.json()["results"][0]["acquired"] is True, lock.text
    reads = [
        {"op": "get", "ns": "queen-locks", "key": "job#0"},
        {"op": "getMany", "ns": "queen-locks", "keys": ["job#0"]},
        {"op": "getPrefix", "ns": "queen-locks", "prefix": "job#"},
    ]
    r = await http.post("/api/v1/kv", json={"operations": reads})
    assert r.status_code == 200, r.text
    got, many, prefix = r.json()["results"]
    assert got["found"] is True and [x["key"] for x in many["rows"]] == ["job#0"] and len(prefix["rows"]) == 1
    before = await conn.fetch("SELECT key, version FROM queen.kv ORDER BY key")
    for op in (
        put("queen-locks"),
        {"op": "delete", "ns": "queen-locks", "key": "job#0"},
        {"op": "incr", "ns": "queen-locks", "key": "job#0", "forever": True},
    ):
        r = await http.post("/api/v1/kv", json={"operations": [op]})
        assert r.status_code == 400 and (r.json()["code"], r.json()["reason"]) == (
            "kv_bad_request",
            "reserved_namespace",
        )
    assert await conn.fetch("SELECT key, version FROM queen.kv ORDER BY key") == before


async def test_the_transaction_rider_applies_the_same_rule(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    await push(http, "tq", [{"payload": 1, "transactionId": "m"}])
    (m,) = (await pop(http, "tq"))["messages"]
    for ns, says in (("NOT A NAMESPACE", "is not a namespace"), ("queen-locks", "only through /api/v1/locks")):
        body = {
            "operations": [
                {"type": "ack", "transactionId": "m", "partitionId": m["partitionId"], "leaseId": m["leaseId"]}
            ],
            "kv": [put(ns)],
        }
        r = await http.post("/api/v1/transaction", json=body)
        assert r.status_code == 400, r.text
        assert r.json()["code"] == "kv_bad_request" and says in r.json()["error"], r.json()
    # nothing applied: the message is still leased (not acked), no KV row
    assert await conn.fetchval("SELECT cursor_offset FROM queen.log_consumers") == 0
    assert await conn.fetchval("SELECT count(*) FROM queen.kv") == 0


async def test_official_client_sees_kv_bad_request(broker: Broker) -> None:
    async with Queen(broker.url) as client:
        with pytest.raises(KvError) as err:
            await client.kv.put("NOT A NAMESPACE", "k", 1, forever=True)
        assert (err.value.status, err.value.code, err.value.reason) == (400, "kv_bad_request", "bad_namespace")
        assert err.value.detail and "NOT A NAMESPACE" in err.value.detail
        with pytest.raises(KvError):
            await client.kv.get("Orders", "k")
        ok = await client.kv.put("test-kv-py", "k", {"v": 1}, forever=True)
        assert ok and (await client.kv.get("test-kv-py", "k"))["value"] == {"v": 1}
        assert not await client.kv.get("queen-locks", "nothing#0")  # readable: a plain miss
