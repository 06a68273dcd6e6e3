"""The data routes served straight from ASGI (queen_pg/api/hot.py: HotRoutes) answer exactly as through FastAPI's
router: the same status, headers and body for the same requests (happy and failing ones), the route
template as the metrics label, and a hot path with another method still 405. Real broker, real HTTP."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from starlette.routing import Match

from queen_pg.api.hot import HotRoutes, hot_routes
from tests.conftest import Broker, broker_settings, fresh_database

LEASE = "00000000-0000-4000-8000-000000000000"


def _hot(broker: Broker) -> HotRoutes:
    app: Any = broker.app.middleware_stack
    while not isinstance(app, HotRoutes):
        app = app.app
    return app


async def _start(db_url: str, hot: bool) -> Broker:
    # the app's own way (QUEEN_HOT_PROTOCOL=0); the protocol's is held to it by tests/test_hot_protocol.py
    b = Broker(broker_settings(db_url, hot_protocol=False))
    if not hot:  # the same app, its data routes through FastAPI's router
        b.app.user_middleware = [m for m in b.app.user_middleware if m.cls is not HotRoutes]
    await b.start()
    return b


async def _script(url: str) -> list[tuple[int, str, Any]]:
    """A session over the data routes, failures included; each answer as (status, content-type, body)."""
    out: list[tuple[int, str, Any]] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:

        async def call(method: str, path: str, **kw: Any) -> Any:
            r = await http.request(method, path, **kw)
            body = (
                r.json()
                if r.content and r.headers.get("content-type", "").startswith("application/json")
                else r.content
            )
            out.append((r.status_code, r.headers.get("content-type", ""), _stable(body)))
            return body

        await call("POST", "/api/v1/push", json={"items": [{"queue": "h", "partition": "p", "payload": {"i": i},
                                                            "transactionId": f"t{i}"} for i in range(3)]})  # fmt: skip
        await call("POST", "/api/v1/push", json={"items": [{"queue": "h", "payload": 1, "transactionId": "t0"}]})
        await call("POST", "/api/v1/push", content=b"{", headers={"content-type": "application/json"})  # 400
        await call("POST", "/api/v1/push", json={"items": []})  # 400: min_length
        await call("GET", "/api/v1/push")  # 405: a hot path, another method
        popped = await call("GET", "/api/v1/pop/queue/h/partition/p", params={"batch": 2, "consumerGroup": "g"})
        await call("GET", "/api/v1/pop/queue/h", params={"batch": "x"})  # 400
        await call("GET", "/api/v1/pop/queue/empty", params={"wait": "false"})  # 204
        await call("GET", "/api/v1/pop")  # 400: neither namespace nor task
        acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]}
                for m in popped["messages"]]  # fmt: skip
        await call("POST", f"/api/v1/lease/{popped['leaseId']}/extend")
        await call("POST", f"/api/v1/lease/{LEASE}/extend")  # unknown lease: 200 success false
        await call("POST", "/api/v1/ack/batch", json={"consumerGroup": "g", "acknowledgments": acks})
        await call("POST", "/api/v1/ack", json={"transactionId": "t2", "partitionId": "999", "consumerGroup": "g"})
        await call("POST", "/api/v1/ack", json={"transactionId": "t\u0000", "partitionId": "1"})  # 400
        await call("POST", "/api/v1/transaction", json={"operations": [
            {"type": "ack", "transactionId": "t2", "partitionId": acks[0]["partitionId"], "leaseId": LEASE,
             "consumerGroup": "g"}]})  # fmt: skip  # a verdict: 200 success false
        pushing = {"type": "push", "items": [{"queue": "h2", "payload": 2}]}
        await call("POST", "/api/v1/transaction", json={"operations": [pushing]})
        await call("GET", "/api/v1/nope")  # 404 (not hot)
        metrics = (await http.get("/metrics")).text
        out.append((0, "metrics", sorted(line.split(" ")[0] for line in metrics.splitlines()
                                         if line.startswith("queen_http_requests_total{"))))  # fmt: skip
    return out


_VOLATILE = {"leaseId", "messageId", "id", "createdAt", "newExpiresAt", "expiresAt", "lease_expires_at",
             "transactionId", "partitionId", "request_id", "requestId"}  # fmt: skip


def _stable(body: Any) -> Any:
    """The answer without what differs between two databases (ids, times)."""
    if isinstance(body, dict):
        return {k: ("*" if k in _VOLATILE and v else _stable(v)) for k, v in body.items()}
    if isinstance(body, list):
        return [_stable(v) for v in body]
    return body


async def test_the_hot_routes_answer_as_the_router_does(db_url: str, pg_server: Any) -> None:
    hot = await _start(db_url, hot=True)
    try:
        with_hot = await _script(hot.url)
        served = _hot(hot).served
    finally:
        await hot.stop()
    cold = await _start(fresh_database(pg_server), hot=False)
    try:
        without = await _script(cold.url)
    finally:
        await cold.stop()
    assert with_hot == without
    assert served == 15  # every data-route call of the script, not the 405, the 404 nor /metrics
    labels = with_hot[-1][2]
    assert any('route="/api/v1/pop/queue/{queue}/partition/{partition}"' in m for m in labels)
    assert any('route="/api/v1/lease/{lease_id}/extend"' in m for m in labels)
    assert not any("/api/v1/pop/queue/h/" in m for m in labels)  # the template, never the raw path
    codes = [s for s, *_ in with_hot]
    assert {400, 405, 404, 204, 201, 200} <= set(codes)


def test_the_router_would_pick_the_same_route_for_every_hot_path(broker: Broker) -> None:
    """HotRoutes answers before the router: for each hot route, no route FastAPI tries earlier fully
    matches its paths (else the two would disagree)."""
    samples = {"/api/v1/push", "/api/v1/pop", "/api/v1/pop/queue/q", "/api/v1/pop/queue/q/partition/p", "/api/v1/ack",
               "/api/v1/ack/batch", f"/api/v1/lease/{LEASE}/extend", "/api/v1/transaction"}  # fmt: skip

    def flat(entries: list[Any]) -> list[Any]:  # included routers (FastAPI's _IncludedRouter) opened, in order
        return [x for r in entries for x in (flat(r.original_router.routes) if hasattr(r, "original_router") else [r])]

    routes = flat(list(broker.app.routes))
    hot = hot_routes()
    for path in samples:
        for method in ("GET", "POST"):
            scope = {"type": "http", "path": path, "method": method, "root_path": ""}
            first = next((child for r in routes for m, child in [r.matches(scope)] if m is Match.FULL), None)
            mine = next((r for r in hot if r.matches(scope)[0] is Match.FULL), None)
            if mine is not None:
                assert first is not None and first.get("endpoint") is mine.endpoint, (method, path)
    assert orjson.dumps(sorted(r.path for r in hot))  # the list is not empty
    assert len(hot) == 8
