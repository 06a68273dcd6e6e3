"""Tenant isolation: two tenants with the same queue, partition, group, KV, lock, timer and trace
names. Every operation of /openapi.json is driven as tenant B with path and query values taken from
tenant A's real names and ids (and once more with names only A has); no answer may carry a byte of
A's data and A's rows must be exactly as before. Plus tenant resolution (header, claim, 400/403)."""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
import jwt
import pytest

from tests.conftest import Broker

A, B = "tenant-a", "tenant-b"
MARK = "MARK-A-7f3c"  # in the names only A has (B sends them too, in the second round)
DATA = "DATA-A-51d2"  # in every value of A (payloads, KV values, lock owner, errors, trace data): B never sends it
SECRET = "tenancy-secret-0123456789-abcdefghijkl"
PAYLOAD_B64 = "eyJ6IjogMX0="  # {"z": 1}


@dataclass
class Seeded:
    pid: str
    lease: str
    lock_token: int
    message_ids: list[str]


def as_tenant(broker: Broker, tenant: str, **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=broker.url, headers={"x-queen-tenant": tenant, **headers}, timeout=30)


async def ok(r: httpx.Response, *status: int) -> Any:
    assert r.status_code in (status or (200, 201)), (r.request.method, r.request.url, r.text)
    return r.json() if r.content else None


async def seed(http: httpx.AsyncClient, mark: str, data: str) -> Seeded:
    only = f"only-{mark}"
    timer_payload = base64.b64encode(f'{{"m": "{data}"}}'.encode()).decode()
    await ok(await http.post("/api/v1/configure", json={"queue": "shared", "namespace": "ns", "task": "t"}))
    items = [
        {"queue": "shared", "partition": "p1", "payload": {"m": data, "i": i}, "transactionId": f"tx-{i}"}
        for i in range(4)
    ]
    items.append({"queue": only, "partition": "p1", "payload": {"m": data}, "transactionId": "tx-0"})
    pushed = await ok(await http.post("/api/v1/push", json={"items": items}))
    popped = await ok(await http.get("/api/v1/pop/queue/shared", params={"consumerGroup": "g", "batch": 2}))
    m0, m1 = popped["messages"]
    dead = {"transactionId": m1["transactionId"], "partitionId": m1["partitionId"], "leaseId": m1["leaseId"]}
    dead |= {"consumerGroup": "g", "status": "dlq", "error": f"boom {data}"}
    await ok(await http.post("/api/v1/ack/batch", json={"acknowledgments": [dead]}))
    await ok(await http.get(f"/api/v1/pop/queue/{only}", params={"consumerGroup": f"grp-{mark}", "batch": 1}))
    await ok(await http.get("/api/v1/pop/queue/shared", params={"batch": 1}))  # queue mode
    kv = [
        {"op": "put", "ns": "kvns", "key": "k", "value": data, "forever": True},
        {"op": "put", "ns": "kvns", "key": f"key-{mark}", "value": data, "forever": True},
    ]
    await ok(await http.post("/api/v1/kv", json={"operations": kv}))
    lock = await ok(
        await http.post(
            "/api/v1/locks", json={"operations": [{"op": "acquire", "name": "L", "ttlSeconds": 600, "owner": data}]}
        )
    )
    timers = [
        {
            "op": "schedule",
            "queue": "shared",
            "timerKey": "tk",
            "payload": timer_payload,
            "delayMs": 600_000,
            "txn": data,
        },
        {"op": "schedule", "queue": only, "timerKey": f"tk-{mark}", "payload": timer_payload, "delayMs": 600_000},
    ]
    await ok(await http.post("/api/v1/timers", json={"operations": timers}))
    trace = {"transactionId": "tx-0", "partitionId": m0["partitionId"], "traceNames": ["trace-name", f"tn-{mark}"]}
    await ok(await http.post("/api/v1/traces", json={**trace, "data": {"m": data}}))
    await ok(
        await http.post(
            "/api/v1/consumer-groups/g/subscription", json={"subscriptionTimestamp": "2020-01-01T00:00:00Z"}
        )
    )
    return Seeded(m0["partitionId"], m0["leaseId"], lock["results"][0]["token"], [p["messageId"] for p in pushed])


TENANT_TABLES = (
    "queues", "log_partitions", "log_groups", "log_consumers", "log_dlq", "kv", "timers",
    "stats_minutes", "traces", "trace_names", "request_outcomes",
)  # fmt: skip


async def snapshot(conn: asyncpg.Connection, tenant: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for table in TENANT_TABLES:
        rows = await conn.fetch(f"SELECT to_jsonb(t)::text AS r FROM queen.{table} t WHERE tenant = $1", tenant)
        out[table] = sorted(r["r"] for r in rows)
    for table in ("log_segments", "log_txns"):
        rows = await conn.fetch(
            f"SELECT to_jsonb(t)::text AS r FROM queen.{table} t JOIN queen.log_partitions p ON p.id = t.partition_id"
            " WHERE p.tenant = $1",
            tenant,
        )
        out[table] = sorted(r["r"] for r in rows)
    return out


def bodies(a: Seeded, q: str, g: str, name: str) -> dict[tuple[str, str], list[Any]]:
    """Request bodies per operation: B acting on A's names and ids."""
    ack = {"transactionId": "tx-0", "partitionId": a.pid, "leaseId": a.lease, "consumerGroup": g}
    return {
        ("post", "/api/v1/push"): [
            {"items": [{"queue": q, "partition": "p1", "payload": {"b": 1}, "transactionId": "tx-0"}]}
        ],
        ("post", "/api/v1/ack"): [ack, {**ack, "consumerGroup": None}],
        ("post", "/api/v1/ack/batch"): [{"acknowledgments": [{**ack, "status": "dlq", "error": "x"}]}],
        ("post", "/api/v1/configure"): [{"queue": q, "namespace": "ns", "task": "t", "options": {"leaseTime": 7}}],
        ("post", "/api/v1/traces"): [{"transactionId": "tx-0", "partitionId": a.pid, "traceNames": [name], "data": {}}],
        # system-wide switches: B may not turn them on for A (checked after the loop)
        ("post", "/api/v1/system/maintenance"): [{"enabled": True}],
        ("post", "/api/v1/system/maintenance/pop"): [{"enabled": True}],
        ("post", "/api/v1/consumer-groups/{group}/queues/{queue}/seek"): [{"toEnd": True}, {"toStart": True}],
        ("post", "/api/v1/consumer-groups/{group}/queues/{queue}/partitions/{partition}/seek"): [{"toEnd": True}],
        ("post", "/api/v1/consumer-groups/{group}/subscription"): [{"subscriptionTimestamp": "2021-01-01T00:00:00Z"}],
        ("post", "/api/v1/kv"): [
            {
                "operations": [
                    {"op": "get", "ns": "kvns", "key": "k"},
                    {"op": "getMany", "ns": "kvns", "keys": ["k", f"key-{MARK}"]},
                    {"op": "getPrefix", "ns": "kvns", "prefix": "", "limit": 100},
                    {"op": "check", "ns": "kvns", "key": "k", "expect": 1},
                ]
            },
            {
                "operations": [
                    {"op": "put", "ns": "kvns", "key": "k", "value": "b", "forever": True},
                    {"op": "incr", "ns": "kvns", "key": f"key-{MARK}", "delta": 1, "forever": True},
                ]
            },
            {"operations": [{"op": "delete", "ns": "kvns", "key": "k"}]},
        ],
        ("post", "/api/v1/locks"): [
            {"operations": [{"op": "get", "name": "L"}]},
            {"operations": [{"op": "release", "name": "L", "token": a.lock_token}]},
            {"operations": [{"op": "renew", "name": "L", "token": a.lock_token, "ttlSeconds": 5, "owner": MARK}]},
            {"operations": [{"op": "acquire", "name": "L", "ttlSeconds": 5, "owner": "b"}]},
        ],
        ("post", "/api/v1/timers"): [
            {
                "operations": [
                    {"op": "cancel", "queue": q, "timerKey": "tk"},
                    {"op": "cancel", "queue": q, "timerKey": f"tk-{MARK}"},
                ]
            },
            {"operations": [{"op": "schedule", "queue": q, "timerKey": "tk", "payload": PAYLOAD_B64, "delayMs": 1000}]},
        ],
        ("post", "/api/v1/transaction"): [
            {
                "operations": [{"type": "ack", **ack}, {"type": "push", "items": [{"queue": q, "payload": 1}]}],
                "kv": [{"op": "put", "ns": "kvns", "key": "k", "value": "tx", "forever": True}],
            },
            {"operations": [{"type": "ack", **ack}], "requiredLeases": [a.lease]},
        ],
    }


def query_values(a: Seeded, q: str, g: str) -> dict[str, str]:
    return {
        "queue": q, "partition": "p1", "consumerGroup": g, "group": g, "namespace": "ns", "task": "t",
        "wait": "false", "batch": "10", "txn": "tx-0", "from": "2020-01-01T00:00:00Z", "minLagSeconds": "0",
        "deleteMetadata": "true",
    }  # fmt: skip


def path_of(template: str, a: Seeded, q: str, g: str, name: str, target: str) -> str:
    values = {
        "queue": q, "partition": "p1", "group": g, "partition_id": a.pid, "transaction_id": "tx-0",
        "lease_id": a.lease, "name": name, "target": target,
    }  # fmt: skip
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    assert "{" not in template, f"no value for a path parameter of {template}"
    return template


ORDER = {"get": 0, "post": 1, "delete": 2}


async def test_every_operation_as_the_other_tenant_sees_and_changes_nothing_of_the_first(
    start_broker: Any, conn: asyncpg.Connection
) -> None:
    broker: Broker = await start_broker(tenancy_header=True, jobs_enabled=False)
    async with as_tenant(broker, A) as ha, as_tenant(broker, B) as hb:
        a = await seed(ha, MARK, DATA)
        await seed(hb, "MARK-B", "DATA-B")
        before = await snapshot(conn, A)
        assert all(before[t] for t in ("queues", "log_dlq", "kv", "timers", "traces", "log_segments"))
        doc = (await hb.get("/openapi.json")).json()
        ops = sorted(
            ((path, method) for path, item in doc["paths"].items() for method in item), key=lambda pm: ORDER[pm[1]]
        )
        called: set[tuple[str, str]] = set()
        leaks: list[str] = []
        for names in (
            ("shared", "g", "trace-name", "shared/tk"),
            (f"only-{MARK}", f"grp-{MARK}", f"tn-{MARK}", f"only-{MARK}/tk-{MARK}"),
        ):
            q, g, name, target = names
            per_op = bodies(a, q, g, name)
            params = query_values(a, q, g)
            for path, method in ops:
                op = doc["paths"][path][method]
                url = path_of(path, a, q, g, name, target)
                query = {
                    p["name"]: params[p["name"]]
                    for p in op.get("parameters", [])
                    if p["in"] == "query" and p["name"] in params
                }
                for body in per_op.get((method, path), [None]):
                    kw: dict[str, Any] = {"params": query}
                    if body is not None:
                        kw["json"] = body
                    r = await hb.request(method.upper(), url, **kw)
                    called.add((path, method))
                    assert r.status_code < 500, (method, url, r.text)
                    sent = url + str(query) + (json.dumps(body) if body is not None else "")
                    for secret in (DATA, MARK, a.lease, *a.message_ids):
                        if secret in r.text and secret not in sent:  # an echo of the request is no leak
                            leaks.append(f"{method.upper()} {url} {body} -> {r.status_code}: {r.text[:300]}")
                            break
        assert called == {(p, m) for p, item in doc["paths"].items() for m in item}
        assert leaks == [], "\n".join(leaks)
        after = await snapshot(conn, A)
        changed = {t: (before[t], after[t]) for t in before if before[t] != after[t]}
        assert changed == {}, changed
        switches = (await ha.get("/api/v1/system/maintenance")).json()
        assert switches["maintenanceMode"] is False and switches["popMaintenanceMode"] is False, switches
        # and tenant A still sees its own data
        r = await ha.get("/api/v1/dlq")
        assert DATA in r.text
        r = await ha.get(f"/api/v1/messages/{a.pid}/tx-0")
        assert r.status_code == 200 and DATA in r.text


async def test_tenant_header_validation_and_default(start_broker: Any) -> None:
    broker: Broker = await start_broker(tenancy_header=True)
    async with httpx.AsyncClient(base_url=broker.url) as http:
        r = await http.get("/api/v1/resources/queues", headers={"x-queen-tenant": ""})
        assert r.status_code == 400 and "tenant" in r.json()["error"]
        r = await http.get("/api/v1/resources/queues", headers={"x-queen-tenant": "x" * 256})
        assert r.status_code == 400
        # the identifier rule (docs/wire.md#text): TAB, and C1 (a header is read as latin-1); the HTTP server
        # itself refuses a DEL in a header
        for control in (b"a\tb", b"a\x85"):
            r = await http.get("/api/v1/resources/queues", headers={"x-queen-tenant": control})
            assert r.status_code == 400 and "control characters" in r.json()["error"], (control, r.text)
        await ok(await http.post("/api/v1/push", json={"items": [{"queue": "dq", "payload": 1}]}))
        listed = await ok(await http.get("/api/v1/resources/queues"))
        assert "dq" in str(listed)  # no header: the default tenant
        r = await http.get("/api/v1/resources/queues", headers={"x-queen-tenant": "other"})
        assert "dq" not in r.text
        # two tenant headers (a proxy appending its own after the client's): 400, nothing written
        two = [("x-queen-tenant", "other"), ("x-queen-tenant", "third"), ("content-type", "application/json")]
        r = await http.post("/api/v1/push", content=b'{"items": [{"queue": "dup", "payload": 1}]}', headers=two)
        assert r.status_code == 400 and "more than once" in r.json()["error"], r.text
        for t in ("other", "third"):
            r = await http.get("/api/v1/resources/queues", headers={"x-queen-tenant": t})
            assert "dup" not in r.text


async def test_tenancy_off_ignores_the_header(broker: Broker) -> None:
    async with as_tenant(broker, "t1") as h1, as_tenant(broker, "t2") as h2:
        await ok(await h1.post("/api/v1/push", json={"items": [{"queue": "same", "payload": 1}]}))
        assert "same" in (await h2.get("/api/v1/resources/queues")).text


def tok(**claims: Any) -> str:
    now = int(time.time())
    return jwt.encode({"sub": "s", "role": "admin", "iat": now, "exp": now + 300, **claims}, SECRET, algorithm="HS256")


async def test_tenant_claim_wins_and_a_disagreeing_header_is_403(start_broker: Any) -> None:
    broker: Broker = await start_broker(
        tenancy_header=True, jwt_enabled=True, jwt_secret=SECRET, jwt_tenant_claim="tenant"
    )
    auth_a = {"Authorization": f"Bearer {tok(tenant=A)}"}
    async with httpx.AsyncClient(base_url=broker.url) as http:
        await ok(await http.post("/api/v1/push", json={"items": [{"queue": "cq", "payload": 1}]}, headers=auth_a))
        r = await http.get("/api/v1/resources/queues", headers={**auth_a, "x-queen-tenant": B})
        assert r.status_code == 403 and r.json()["code"] == "forbidden"
        r = await http.get("/api/v1/resources/queues", headers={**auth_a, "x-queen-tenant": A})
        assert "cq" in r.text
        r = await http.get("/api/v1/resources/queues", headers={"Authorization": f"Bearer {tok(tenant=B)}"})
        assert r.status_code == 200 and "cq" not in r.text
        r = await http.get("/api/v1/resources/queues", headers={"Authorization": f"Bearer {tok()}"})
        assert r.status_code == 403  # a token that names no tenant
        # /metrics (a skip path) without a token cannot pick a tenant by header
        r = await http.get("/metrics", headers={"x-queen-tenant": A})
        assert f'tenant="{A}"' not in r.text
        # the per-queue series need a token, and show the token's tenant's queues only
        assert (await http.get("/metrics/queues", headers={"x-queen-tenant": A})).status_code == 401
        r = await http.get("/metrics/queues", headers=auth_a)
        assert r.status_code == 200 and 'queue="cq"' in r.text
        r = await http.get("/metrics/queues", headers={"Authorization": f"Bearer {tok(tenant=B)}"})
        assert r.status_code == 200 and 'queue="cq"' not in r.text


@pytest.mark.parametrize("tenancy", [True])
async def test_metrics_show_only_the_callers_tenant(start_broker: Any, tenancy: bool) -> None:
    broker: Broker = await start_broker(tenancy_header=tenancy)
    async with as_tenant(broker, A) as ha, as_tenant(broker, B) as hb:
        await ok(await ha.post("/api/v1/push", json={"items": [{"queue": f"only-{MARK}", "payload": 1}]}))
        await ok(await hb.post("/api/v1/push", json={"items": [{"queue": "bq", "payload": 1}]}))
        mb = (await hb.get("/metrics/queues")).text
        assert MARK not in mb and 'queue="bq"' in mb
        assert MARK in (await ha.get("/metrics/queues")).text
        await ha.post("/api/v1/stats/refresh")
        await hb.post("/api/v1/stats/refresh")
        ma, mb = (await ha.get("/metrics")).text, (await hb.get("/metrics")).text
        assert f'queen_queues{{tenant="{A}"}} 1.0' in ma and f'tenant="{B}"' not in ma
        assert f'queen_queues{{tenant="{B}"}} 1.0' in mb and f'tenant="{A}"' not in mb


async def test_only_the_default_tenant_flips_the_system_wide_maintenance_switches(
    start_broker: Any, conn: asyncpg.Connection
) -> None:
    """Regression: any tenant's admin could pause every tenant's pushes or pops."""
    broker: Broker = await start_broker(tenancy_header=True)
    async with as_tenant(broker, A) as ha, as_tenant(broker, B) as hb, httpx.AsyncClient(base_url=broker.url) as op:
        for path in ("/api/v1/system/maintenance", "/api/v1/system/maintenance/pop"):
            r = await hb.post(path, json={"enabled": True})
            assert r.status_code == 403 and r.json()["code"] == "forbidden", r.text
            assert "default tenant" in r.json()["error"]
        on = "SELECT count(*) FROM queen.system_settings WHERE key LIKE 'maintenance.%' AND value = 'true'::jsonb"
        assert await conn.fetchval(on) == 0
        r = await ha.post("/api/v1/push", json={"items": [{"queue": "q", "payload": 1}]})
        assert r.status_code == 201, r.text  # A's traffic is untouched
        # the operator (no header: the default tenant) flips them for everyone, and back
        r = await op.post("/api/v1/system/maintenance", json={"enabled": True})
        assert r.status_code == 200 and r.json()["maintenanceMode"] is True, r.text
        r = await ha.post("/api/v1/push", json={"items": [{"queue": "q", "payload": 2}]})
        assert r.status_code == 503 and r.json()["code"] == "maintenance", r.text
        r = await op.post("/api/v1/system/maintenance", json={"enabled": False})
        assert r.status_code == 200 and r.json()["maintenanceMode"] is False, r.text
        # reading them stays open to every tenant
        assert (await hb.get("/api/v1/system/maintenance/pop")).json()["popMaintenanceMode"] is False


async def test_a_tenant_claims_admin_cannot_flip_maintenance(start_broker: Any) -> None:
    broker: Broker = await start_broker(jwt_enabled=True, jwt_secret=SECRET, jwt_tenant_claim="tenant")
    async with httpx.AsyncClient(base_url=broker.url) as http:
        r = await http.post(
            "/api/v1/system/maintenance/pop",
            json={"enabled": True},
            headers={"Authorization": f"Bearer {tok(tenant=B)}"},
        )
        assert r.status_code == 403 and r.json()["code"] == "forbidden", r.text
        operator = {"Authorization": f"Bearer {tok(tenant='default')}"}
        r = await http.post("/api/v1/system/maintenance/pop", json={"enabled": True}, headers=operator)
        assert r.status_code == 200 and r.json()["popMaintenanceMode"] is True, r.text
        r = await http.post("/api/v1/system/maintenance/pop", json={"enabled": False}, headers=operator)
        assert r.status_code == 200 and r.json()["popMaintenanceMode"] is False, r.text
