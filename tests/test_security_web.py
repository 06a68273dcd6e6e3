"""Web and host hygiene, and the route -> level table: 415 on non-JSON writes, QUEEN_ALLOWED_HOSTS,
optional CORS, and every route of the app has a level."""

from __future__ import annotations

from typing import Any

import fastapi.routing
import httpx
import pytest

from queen_pg.app import create_app
from queen_pg.security.roles import ROUTES, Level, RouteTable
from queen_pg.settings import Settings
from tests.conftest import Broker


def app_routes() -> set[tuple[str, str]]:
    app = create_app(Settings(database_url="postgresql://unused/x"))
    iter_contexts = getattr(fastapi.routing, "iter_route_contexts", None)
    if iter_contexts is None:
        pairs = [(r.path, r.methods) for r in app.routes]  # with :path converters
    else:
        pairs = [(c.path, c.methods) for c in iter_contexts(app.routes)]
    return {(m, path) for path, methods in pairs for m in (methods or ()) if m != "HEAD"}


def test_every_route_has_a_level_and_the_table_names_no_ghosts() -> None:
    routes = app_routes()
    assert len(routes) > 50
    missing = sorted(routes - ROUTES.keys())
    assert missing == [], f"routes without an access level in queen_pg/security/roles.py: {missing}"
    ghosts = sorted(ROUTES.keys() - routes)
    assert ghosts == [], f"levels for routes the app does not have: {ghosts}"


def test_route_table_matching() -> None:
    t = RouteTable()
    assert t.level("GET", "/api/v1/consumer-groups/lagging") == Level.READ_ONLY
    assert t.level("DELETE", "/api/v1/consumer-groups/g") == Level.ADMIN
    assert t.level("HEAD", "/api/v1/resources/queues") == Level.READ_ONLY
    assert t.level("POST", "/api/v1/consumer-groups/g/queues/q/partitions/p/seek") == Level.ADMIN
    assert t.level("GET", "/api/v1/pop/queue/a%2Fb") == Level.READ_WRITE
    assert t.level("POST", "/api/v1/resources/queues") is None  # no such route: any valid token, then 405


@pytest.mark.parametrize(
    "headers",
    [
        {"content-type": "text/plain"},  # the CSRF shape: a simple cross-site POST
        {"content-type": "application/x-www-form-urlencoded"},
        {"content-type": "multipart/form-data; boundary=x"},
        {},  # a body with no Content-Type (a Blob fetch) is not JSON either
    ],
)
async def test_state_changing_requests_must_be_json(http: httpx.AsyncClient, headers: dict[str, str]) -> None:
    body = b'{"items":[{"queue":"csrf","payload":1}]}'
    r = await http.post("/api/v1/push", content=body, headers=headers)
    assert r.status_code == 415, r.text
    assert r.json()["code"] == "unsupported_media_type"
    r = await http.post("/api/v1/system/maintenance", content=b'{"enabled":true}', headers=headers)
    assert r.status_code == 415
    # nothing was written
    assert (await http.get("/api/v1/resources/queues/csrf")).status_code == 404
    assert (await http.get("/api/v1/system/maintenance")).json()["maintenanceMode"] is False


async def test_json_variants_and_empty_bodies_pass(http: httpx.AsyncClient) -> None:
    r = await http.post(
        "/api/v1/push",
        content=b'{"items":[{"queue":"okq","payload":1}]}',
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert r.status_code == 201
    assert (await http.post("/api/v1/stats/refresh")).status_code == 200  # no body, no Content-Type
    assert (await http.get("/api/v1/resources/queues", headers={"content-type": "text/plain"})).status_code == 200


async def test_allowed_hosts(start_broker: Any) -> None:
    b: Broker = await start_broker(allowed_hosts="queen.internal, 127.0.0.1")
    async with httpx.AsyncClient(base_url=b.url) as http:
        assert (await http.get("/health")).status_code == 200  # Host: 127.0.0.1:port
        assert (await http.get("/health", headers={"host": "queen.internal"})).status_code == 200
        r = await http.get("/api/v1/resources/queues", headers={"host": "evil.example"})
        assert r.status_code == 400 and r.json()["code"] == "bad_host"
        r = await http.post("/api/v1/push", json={"items": [{"queue": "h", "payload": 1}]}, headers={"host": "x.test"})
        assert r.status_code == 400


async def test_cors_off_by_default_and_on_when_configured(http: httpx.AsyncClient, start_broker: Any) -> None:
    pre = {"origin": "https://app.test", "access-control-request-method": "POST"}
    r = await http.options("/api/v1/push", headers=pre)
    assert "access-control-allow-origin" not in r.headers
    b: Broker = await start_broker(cors_origins="https://app.test")
    async with httpx.AsyncClient(base_url=b.url) as h2:
        r = await h2.options(
            "/api/v1/push", headers={**pre, "access-control-request-headers": "authorization,content-type"}
        )
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "https://app.test"
        r = await h2.options("/api/v1/push", headers={**pre, "origin": "https://evil.test"})
        assert r.status_code == 400
        r = await h2.get("/api/v1/resources/queues", headers={"origin": "https://evil.test"})
        assert "access-control-allow-origin" not in r.headers
