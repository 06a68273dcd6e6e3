"""``/openapi.json`` and ``/docs`` from a real broker: every route is documented with its request body,
query parameters and answers, every ``$ref`` resolves, and real answers (and the request bodies that
produced them) validate against the documented schemas (jsonschema, refs resolved in the document)."""

from __future__ import annotations

import base64
from typing import Any

import fastapi.routing
import httpx
import jsonschema
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from tests.conftest import Broker

REF_PREFIX = "#/components/schemas/"
ERROR_REF = {"$ref": REF_PREFIX + "ErrorBody"}
NO_BODY_POSTS = {  # the client sends Content-Length: 0 (docs/wire.md#empty-posts)
    "/api/v1/lease/{lease_id}/extend",
    "/api/v1/messages/{partition_id}/{transaction_id}/retry",
    "/api/v1/stats/refresh",
}
PAYLOAD = base64.b64encode(b'{"z": 1}').decode()


def app_operations(app: FastAPI) -> set[tuple[str, str]]:
    """(path template, method) of every APIRoute of the app under /api/v1, /health and /metrics.
    FastAPI >= 0.16x keeps included routers as route contexts (``iter_route_contexts``)."""
    iter_contexts = getattr(fastapi.routing, "iter_route_contexts", None)
    if iter_contexts is None:
        routes = [(r.path_format, r.methods, r) for r in app.routes]
    else:
        routes = [(c.path_format, c.methods, c.original_route) for c in iter_contexts(app.routes)]
    return {
        (path, method.lower())
        for path, methods, route in routes
        if isinstance(route, APIRoute) and (path.startswith("/api/v1/") or path in ("/health", "/metrics"))
        for method in methods
    }


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, method, op) for path, ops in doc["paths"].items() for method, op in ops.items()]


def resolve(doc: dict[str, Any], node: Any, seen: set[str] | None = None) -> set[str]:
    """Every component reachable from ``node``; AssertionError on a ref that points nowhere."""
    seen = set() if seen is None else seen
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            assert ref.startswith(REF_PREFIX), f"unexpected $ref {ref}"
            name = ref.removeprefix(REF_PREFIX)
            assert name in doc["components"]["schemas"], f"dangling $ref {ref}"
            if name not in seen:
                seen.add(name)
                resolve(doc, doc["components"]["schemas"][name], seen)
        for key, value in node.items():
            if key != "$ref":
                resolve(doc, value, seen)
    elif isinstance(node, list):
        for value in node:
            resolve(doc, value, seen)
    return seen


def pointer(*parts: str) -> str:
    return "#/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def validator(doc: dict[str, Any], *parts: str) -> jsonschema.Draft202012Validator:
    """A validator of the schema at ``parts`` inside the document, its ``#/components`` refs resolved."""
    node: Any = doc
    for p in parts:
        assert p in node, f"{'/'.join(parts)} is not documented"
        node = node[p]
    return jsonschema.Draft202012Validator({**doc, "$ref": pointer(*parts)})


def answer_validator(doc: dict[str, Any], path: str, method: str, status: int) -> jsonschema.Draft202012Validator:
    return validator(doc, "paths", path, method, "responses", str(status), "content", "application/json", "schema")


@pytest.fixture
async def doc(http: httpx.AsyncClient) -> dict[str, Any]:
    r = await http.get("/openapi.json")
    assert r.status_code == 200
    d: dict[str, Any] = r.json()
    return d


async def test_every_route_is_documented(broker: Broker, doc: dict[str, Any]) -> None:
    expected = app_operations(broker.app)
    assert len(expected) >= 50  # push, pops, acks, ..., the admin family: not a vacuous pass
    got = {(path, method) for path, method, _ in operations(doc)}
    assert expected <= got, f"undocumented: {sorted(expected - got)}"
    for path, method, op in operations(doc):
        assert op.get("summary"), f"{method} {path} has no summary"


async def test_request_bodies_are_documented_and_resolve(doc: dict[str, Any]) -> None:
    posts = [(path, method, op) for path, method, op in operations(doc) if method in ("post", "put", "patch")]
    assert len(posts) >= 15
    for path, method, op in posts:
        if path in NO_BODY_POSTS:
            assert "requestBody" not in op, f"{method} {path} takes no body"
            assert "no body" in (op.get("description", "") + op["summary"]).lower()
            continue
        assert "requestBody" in op, f"{method} {path} documents no request body"
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        reached = resolve(doc, schema)
        assert reached, f"{method} {path}: the body schema names no model"
        top = doc["components"]["schemas"][schema["$ref"].removeprefix(REF_PREFIX)]
        assert top["type"] == "object" and top["properties"], f"{method} {path}: an empty body model"


async def test_answers_and_errors_are_documented(doc: dict[str, Any]) -> None:
    for path, method, op in operations(doc):
        responses = op["responses"]
        ok = {s: r for s, r in responses.items() if s.startswith("2")}
        assert ok, f"{method} {path} documents no success"
        if path in ("/metrics", "/metrics/queues"):  # Prometheus text
            assert "text/plain" in next(iter(ok["200"]["content"]))
            continue
        with_schema = [s for s, r in ok.items() if r.get("content", {}).get("application/json", {}).get("schema")]
        assert with_schema or set(ok) == {"204"}, f"{method} {path}: no 2xx answer has a schema"
        for s in with_schema:
            resolve(doc, ok[s]["content"]["application/json"]["schema"])
        errors = {s: r for s, r in responses.items() if s[0] in "45"}
        assert "503" in errors, f"{method} {path}: 503 (database unavailable) is not documented"
        for status, r in errors.items():
            assert r["content"]["application/json"]["schema"] == ERROR_REF, f"{method} {path} {status}"
    # the app answers request-validation errors 400 (not FastAPI's 422 HTTPValidationError)
    assert "HTTPValidationError" not in doc["components"]["schemas"]


async def test_the_whole_document_resolves_and_its_schemas_are_valid(doc: dict[str, Any]) -> None:
    reached = resolve(doc, doc["paths"])
    assert {"PushBody", "PopAnswer", "KvRequest", "KvPut", "TimerSchedule", "LocksRequest", "ErrorBody"} <= reached
    for schema in doc["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)
    pops = doc["paths"]["/api/v1/pop/queue/{queue}"]["get"]
    assert {"batch", "wait", "timeout", "consumerGroup", "autopilot", "subscriptionMode"} <= {
        p["name"] for p in pops["parameters"]
    }
    assert "204" in pops["responses"]


async def test_docs_page(http: httpx.AsyncClient) -> None:
    r = await http.get("/docs")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert "swagger-ui" in r.text and "/openapi.json" in r.text


class Calls:
    """Requests whose body is checked against the documented request schema and whose answer is checked
    against the documented schema of its status."""

    def __init__(self, http: httpx.AsyncClient, doc: dict[str, Any]) -> None:
        self.http = http
        self.doc = doc
        self.checked: set[tuple[str, str]] = set()

    async def __call__(self, method: str, template: str, status: int, path: str | None = None, **kw: Any) -> Any:
        op = self.doc["paths"][template][method]
        if "json" in kw and "requestBody" in op:
            schema = ("paths", template, method, "requestBody", "content", "application/json", "schema")
            validator(self.doc, *schema).validate(kw["json"])
        r = await self.http.request(method, path or template, **kw)
        assert r.status_code == status, (method, path or template, r.text)
        if status == 204:
            assert str(status) in op["responses"]
            return None
        body = r.json()
        answer_validator(self.doc, template, method, status).validate(body)
        self.checked.add((template, method))
        return body


async def test_data_plane_answers_match_their_schemas(http: httpx.AsyncClient, doc: dict[str, Any]) -> None:
    call = Calls(http, doc)
    await call("post", "/api/v1/configure", 200, json={"queue": "q", "namespace": "ns", "options": {"leaseTime": 60}})
    items = [{"queue": "q", "partition": "p", "payload": {"n": i}, "transactionId": f"t{i}"} for i in range(4)]
    pushed = await call("post", "/api/v1/push", 201, json={"items": items})
    assert [p["status"] for p in pushed] == ["queued"] * 4
    dup = await call("post", "/api/v1/push", 201, json={"items": items[:1]})
    assert dup[0]["status"] == "duplicate"
    popped = await call(
        "get", "/api/v1/pop/queue/{queue}", 200, "/api/v1/pop/queue/q", params={"batch": 2, "autopilot": "true"}
    )
    assert popped["autopilot"]["batch"] == 2
    m1, m2 = popped["messages"]
    lease = await call("post", "/api/v1/lease/{lease_id}/extend", 200, f"/api/v1/lease/{m1['leaseId']}/extend")
    assert lease["success"] is True
    gone = await call("post", "/api/v1/lease/{lease_id}/extend", 200, "/api/v1/lease/nope/extend")
    assert gone["success"] is False and gone["error"]
    ack = {"transactionId": m1["transactionId"], "partitionId": m1["partitionId"], "leaseId": m1["leaseId"]}
    assert (await call("post", "/api/v1/ack", 200, json=ack))[0]["success"] is True
    batch = {"acknowledgments": [{**ack, "transactionId": m2["transactionId"], "status": "dlq", "error": "boom"}]}
    assert (await call("post", "/api/v1/ack/batch", 200, json=batch))[0]["dlq"] is True
    refused = await call("post", "/api/v1/ack", 200, json={"transactionId": "x", "partitionId": "999"})
    assert refused[0]["success"] is False
    tagged = await call("get", "/api/v1/pop", 200, params={"namespace": "ns", "consumerGroup": "g"})
    assert tagged["consumerGroup"] == "g"
    one = await call(
        "get",
        "/api/v1/pop/queue/{queue}/partition/{partition}",
        200,
        "/api/v1/pop/queue/q/partition/p",
        params={"consumerGroup": "g2"},
    )
    assert len(one["messages"]) == 1
    await call("get", "/api/v1/pop/queue/{queue}", 204, "/api/v1/pop/queue/empty")

    tx = {
        "operations": [
            {
                "type": "ack",
                "transactionId": one["messages"][0]["transactionId"],
                "partitionId": one["partitionId"],
                "consumerGroup": "g2",
                "leaseId": one["leaseId"],
            },
            {"type": "push", "items": [{"queue": "out", "payload": {"y": 1}}]},
        ],
        "requiredLeases": [one["leaseId"]],
        "kv": [{"op": "putIfAbsent", "ns": "once", "key": "k", "value": True, "ttlSeconds": 60, "required": True}],
        "timers": [{"op": "schedule", "queue": "later", "timerKey": "a/b", "payload": PAYLOAD, "delayMs": 60000}],
    }
    done = await call("post", "/api/v1/transaction", 200, json=tx)
    assert done["success"] is True and [r.get("type") for r in done["results"][:2]] == ["ack", "push"]
    verdict = await call("post", "/api/v1/transaction", 200, json={"operations": [], "kv": tx["kv"]})
    assert verdict["reason"] == "kv_precondition" and verdict["failedIndex"] == 0

    kv_ops = [
        {"op": "get", "ns": "once", "key": "k"},
        {"op": "get", "ns": "once", "key": "missing"},
        {"op": "getMany", "ns": "once", "keys": ["k", "x"]},
        {"op": "getPrefix", "ns": "once", "prefix": "k", "limit": 10},
        {"op": "put", "ns": "n", "key": "a", "value": None, "forever": True},
        {"op": "putIfAbsent", "ns": "once", "key": "k", "value": 1, "ttlSeconds": 5},
        {"op": "incr", "ns": "n", "key": "c", "delta": 2, "max": 10, "ttlSeconds": 5},
        {"op": "check", "ns": "once", "key": "k", "expect": 1},
        {"op": "delete", "ns": "n", "key": "gone"},
    ]
    kv = await call("post", "/api/v1/kv", 200, json={"operations": kv_ops})
    assert [r["op"] for r in kv["results"]] == [op["op"] for op in kv_ops]
    lost = await call("post", "/api/v1/kv", 200, json={"operations": [{**kv_ops[7], "expect": 9, "required": True}]})
    assert lost["ok"] is False and lost["kvReason"] == "version"

    lock_ops = [
        {"op": "acquire", "name": "L", "ttlSeconds": 30, "owner": "me"},
        {"op": "acquire", "name": "L", "ttlSeconds": 30, "owner": "other"},
        {"op": "get", "name": "L"},
    ]
    won, held, info = (await call("post", "/api/v1/locks", 200, json={"operations": lock_ops}))["results"]
    assert won["acquired"] and not held["acquired"] and info["held"]
    more = [
        {"op": "renew", "name": "L", "token": won["token"], "ttlSeconds": 30, "owner": "me"},
        {"op": "release", "name": "L", "token": 1},
    ]
    renewed, release = (await call("post", "/api/v1/locks", 200, json={"operations": more}))["results"]
    assert renewed["renewed"] and not release["released"]

    timer_ops = [
        {"op": "schedule", "queue": "later", "timerKey": "t1", "payload": PAYLOAD, "delayMs": 60000, "txn": "x1"},
        {"op": "cancel", "queue": "later", "timerKey": "none"},
    ]
    scheduled = await call("post", "/api/v1/timers", 200, json={"operations": timer_ops})
    assert [r["status"] for r in scheduled["results"]] == ["scheduled", "absent"]
    peek = await call("get", "/api/v1/timers/{target}", 200, "/api/v1/timers/later/a/b")
    assert peek["found"] is True and peek["data"] == {"z": 1}
    listed = await call("get", "/api/v1/timers/{target}", 200, "/api/v1/timers/later", params={"limit": 1})
    assert listed["truncated"] is True and len(listed["rows"]) == 1
    cancelled = await call("delete", "/api/v1/timers/{target}", 200, "/api/v1/timers/later/t1")
    assert cancelled["status"] == "cancelled"

    # error answers are ErrorBody, the family envelopes included
    await call("post", "/api/v1/push", 400, content=b"{", headers={"content-type": "application/json"})
    bad = await call(
        "post",
        "/api/v1/kv",
        400,
        content=b'{"operations": [{"op": "nope"}]}',
        headers={"content-type": "application/json"},
    )
    assert bad["error"] == "kv_bad_request" and bad["reason"] == "unknown_op"
    await call(
        "post",
        "/api/v1/timers",
        400,
        content=b'{"operations": [{"op": "schedule", "delay_ms": 1}]}',
        headers={"content-type": "application/json"},
    )
    # a wrong answer does not validate: the schemas constrain something
    with pytest.raises(jsonschema.ValidationError):
        answer_validator(doc, "/api/v1/push", "post", 201).validate([{"index": 0, "status": "queued"}])
    with pytest.raises(jsonschema.ValidationError):
        answer_validator(doc, "/api/v1/pop/queue/{queue}", "get", 200).validate({**popped, "messages": [{}]})
    # a body the validators refuse does not validate against the documented request either
    kv_request = validator(doc, "paths", "/api/v1/kv", "post", "requestBody", "content", "application/json", "schema")
    for refused_op in (
        {"op": "put", "ns": "n", "key": "k", "value": 1, "ttl": 5},
        {"op": "check", "ns": "n", "key": "k"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            kv_request.validate({"operations": [refused_op]})
    assert len(call.checked) >= 12


async def test_admin_answers_match_their_schemas(http: httpx.AsyncClient, doc: dict[str, Any]) -> None:
    call = Calls(http, doc)
    await call("post", "/api/v1/configure", 200, json={"queue": "q", "namespace": "ns", "task": "tk"})
    items = [{"queue": "q", "payload": {"n": i}, "transactionId": f"t{i}"} for i in range(3)]
    await call("post", "/api/v1/push", 201, json={"items": items})
    popped = await call("get", "/api/v1/pop/queue/{queue}", 200, "/api/v1/pop/queue/q", params={"consumerGroup": "g"})
    m = popped["messages"][0]
    ack = {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]}
    await call("post", "/api/v1/ack", 200, json={**ack, "status": "dlq", "consumerGroup": "g", "error": "boom"})
    pid = m["partitionId"]

    for template in (
        "/api/v1/resources/overview",
        "/api/v1/resources/queues",
        "/api/v1/resources/partitions",
        "/api/v1/resources/namespaces",
        "/api/v1/resources/tasks",
        "/api/v1/status",
        "/api/v1/status/queues",
        "/api/v1/consumer-groups",
        "/api/v1/analytics/system-metrics",
        "/api/v1/analytics/worker-metrics",
        "/api/v1/system/maintenance",
        "/api/v1/system/maintenance/pop",
        "/health",
    ):
        await call("get", template, 200)
    await call("get", "/api/v1/resources/queues/{queue}", 200, "/api/v1/resources/queues/q")
    await call("get", "/api/v1/resources/queues/{queue}/depth", 200, "/api/v1/resources/queues/q/depth?group=g")
    await call("get", "/api/v1/status/queues/{queue}", 200, "/api/v1/status/queues/q")
    await call("get", "/api/v1/status/analytics", 200, params={"queue": "q", "interval": "hour"})
    await call("get", "/api/v1/consumer-groups/lagging", 200, params={"minLagSeconds": 0})
    await call("get", "/api/v1/consumer-groups/{group}", 200, "/api/v1/consumer-groups/g")
    dead = await call("get", "/api/v1/dlq", 200, params={"queue": "q"})
    assert dead["total"] == 1
    page = await call("get", "/api/v1/messages", 200, params={"queue": "q", "consumerGroup": "g"})
    assert {msg["status"] for msg in page["messages"]} == {"dead", "pending"}
    await call("get", "/api/v1/messages/{partition_id}/{transaction_id}", 200, f"/api/v1/messages/{pid}/t1")
    trace = {"transactionId": "t1", "partitionId": pid, "traceNames": ["order-1"], "data": {"step": 1}}
    await call("post", "/api/v1/traces", 201, json=trace)
    await call("get", "/api/v1/traces/names", 200)
    await call("get", "/api/v1/traces/by-name/{name}", 200, "/api/v1/traces/by-name/order-1")
    await call("get", "/api/v1/traces/{partition_id}/{transaction_id}", 200, f"/api/v1/traces/{pid}/t1")
    seek = "/api/v1/consumer-groups/{group}/queues/{queue}/seek"
    await call("post", seek, 200, "/api/v1/consumer-groups/g/queues/q/seek", json={"toStart": True})
    await call(
        "post",
        "/api/v1/consumer-groups/{group}/queues/{queue}/partitions/{partition}/seek",
        200,
        "/api/v1/consumer-groups/g/queues/q/partitions/Default/seek",
        json={"timestamp": "2020-01-01T00:00:00Z"},
    )
    await call("post", seek, 400, "/api/v1/consumer-groups/g/queues/q/seek")  # an empty body: no target
    sub = "/api/v1/consumer-groups/{group}/subscription"
    await call("post", sub, 200, "/api/v1/consumer-groups/g/subscription", json={"subscriptionTimestamp": "now"})
    for template in ("/api/v1/system/maintenance", "/api/v1/system/maintenance/pop"):
        assert (await call("post", template, 200, json={"enabled": False}))["success"] is True
    await call("post", "/api/v1/stats/refresh", 200)
    retry = "/api/v1/messages/{partition_id}/{transaction_id}/retry"
    await call("post", retry, 404, f"/api/v1/messages/{pid}/nope/retry")
    await call("delete", "/api/v1/messages/{partition_id}/{transaction_id}", 200, f"/api/v1/messages/{pid}/t2")
    await call("get", "/api/v1/resources/queues/{queue}", 404, "/api/v1/resources/queues/nope")
    await call("get", "/api/v1/messages", 400)  # queue is required
    await call("delete", "/api/v1/consumer-groups/{group}/queues/{queue}", 200, "/api/v1/consumer-groups/g/queues/q")
    await call("delete", "/api/v1/consumer-groups/{group}", 404, "/api/v1/consumer-groups/g")
    await call("delete", "/api/v1/resources/queues/{queue}", 200, "/api/v1/resources/queues/q")
    assert len(call.checked) >= 35
