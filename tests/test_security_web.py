"""Web and host hygiene: 415 on non-JSON writes, QUEEN_ALLOWED_HOSTS, optional CORS, cross-site
requests, framing (the route -> level table: tests/test_security_roles.py)."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import httpx
import pytest

from queen_pg.api.hot import HotRoutes
from queen_pg.app import create_app
from queen_pg.security.middleware import Security
from queen_pg.settings import Settings
from tests.conftest import Broker
from tests.helpers import pop, push


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


# --- cross-site requests, DNS rebinding and framing, with the default settings ----------------------


async def _pid(http: httpx.AsyncClient, queue: str) -> str:
    r = await http.get("/api/v1/messages", params={"queue": queue, "limit": 1})
    assert r.status_code == 200, r.text
    pid: str = r.json()["messages"][0]["partitionId"]
    return pid


def test_the_hot_routes_are_inside_the_security_middleware() -> None:
    """The data plane's fast path (HotRoutes) answers push/pop/ack itself: it must sit inside Security."""
    app = create_app(Settings(database_url="postgresql://unused/x"))
    order = [m.cls for m in app.user_middleware]  # outermost first
    assert order.index(Security) < order.index(HotRoutes)
    assert app.state.checks.table.write_gets == ("/api/v1/pop", "/api/v1/pop/queue/")  # the GETs that lease or ack


@pytest.mark.parametrize("auto_ack", [True, False])
async def test_a_cross_site_image_cannot_pop(http: httpx.AsyncClient, auto_ack: bool) -> None:
    """<img src="http://127.0.0.1:6632/api/v1/pop/queue/q?autoAck=true"> on another site: the browser
    sends the GET with Sec-Fetch-Site: cross-site and no Origin. It must neither ack nor lease."""
    await push(http, "img", [{"payload": {"n": 1}, "transactionId": "img-1"}])
    img = {"sec-fetch-site": "cross-site", "sec-fetch-mode": "no-cors", "sec-fetch-dest": "image"}
    params = {"autoAck": str(auto_ack).lower(), "wait": "false"}
    for path in ("/api/v1/pop/queue/img", "/api/v1/pop/queue/img/partition/Default", "/api/v1/pop"):
        r = await http.get(path, params=params, headers=img)
        assert r.status_code == 403, (path, r.status_code, r.text)
        assert r.json()["code"] == "cross_site"
    # nothing was acked, nothing is leased: a header-less client gets the message now
    (m,) = (await pop(http, "img", wait=False))["messages"]
    assert m["transactionId"] == "img-1"


async def test_a_cross_site_form_cannot_move_a_message_to_the_dlq(http: httpx.AsyncClient) -> None:
    """fetch(url, {method: "POST", mode: "no-cors"}) from http://evil.example: no body, so the 415
    rule does not apply; an older browser sends Origin but no Sec-Fetch-Site."""
    await push(http, "mvx", [{"payload": i, "transactionId": f"t{i}"} for i in range(2)])
    pid = await _pid(http, "mvx")
    assert await pop(http, "mvx", batch=1, wait=False)  # queue mode has a cursor now (t0 leased)
    for headers in ({"origin": "http://evil.example"}, {"origin": "null"}, {"sec-fetch-site": "cross-site"}):
        r = await http.post(f"/api/v1/messages/{pid}/t1/dlq", headers=headers)
        assert r.status_code == 403, (headers, r.text)
        assert r.json()["code"] == "cross_site"
    assert (await http.get("/api/v1/dlq", params={"queue": "mvx"})).json()["messages"] == []
    # the dashboard's own request (same origin) does it
    own = {"origin": str(http.base_url).rstrip("/"), "sec-fetch-site": "same-origin"}
    r = await http.post(f"/api/v1/messages/{pid}/t1/dlq", headers=own)
    assert r.status_code == 200, r.text
    assert [
        m["transactionId"] for m in (await http.get("/api/v1/dlq", params={"queue": "mvx"})).json()["messages"]
    ] == ["t1"]


@pytest.mark.parametrize(
    "headers",
    [
        {"sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "same-site"},  # another port of localhost is the same site
        {"sec-fetch-site": "same-site", "origin": "http://localhost:3000"},
        {"origin": "http://evil.example"},
        {"origin": "http://127.0.0.1:1"},  # the same host, another port: another origin
        {"origin": "null"},
    ],
)
async def test_cross_site_writes_without_a_body_are_refused(http: httpx.AsyncClient, headers: dict[str, str]) -> None:
    for method, path in (
        ("POST", "/api/v1/stats/refresh"),
        ("DELETE", "/api/v1/resources/queues/keep"),
        ("POST", "/api/v1/system/maintenance"),
    ):
        if path.endswith("keep"):
            await push(http, "keep", [{"payload": 1}])
        r = await http.request(method, path, headers=headers)
        assert r.status_code == 403 and r.json()["code"] == "cross_site", (method, path, r.text)
    assert (await http.get("/api/v1/resources/queues/keep")).status_code == 200
    assert (await http.get("/api/v1/system/maintenance")).json()["maintenanceMode"] is False


async def test_same_origin_and_header_less_requests_still_work(http: httpx.AsyncClient) -> None:
    own = str(http.base_url).rstrip("/")
    cases: list[dict[str, str]] = [
        {},  # curl, the official client, server-to-server
        {"sec-fetch-site": "same-origin", "origin": own},  # the dashboard
        {"sec-fetch-site": "none"},  # the operator typed the URL
        {"origin": own},  # a browser without Sec-Fetch-Site, same origin
    ]
    for i, headers in enumerate(cases):
        await push(http, f"ok{i}", [{"payload": i}])
        r = await http.get(f"/api/v1/pop/queue/ok{i}", params={"wait": "false", "autoAck": "true"}, headers=headers)
        assert r.status_code == 200, (headers, r.text)
        r = await http.delete(f"/api/v1/resources/queues/ok{i}", headers=headers)
        assert r.status_code == 200, (headers, r.text)
    # reads stay open to cross-site requests: they change nothing and, without CORS, the page cannot read them
    cross = {"sec-fetch-site": "cross-site", "origin": "http://evil.example"}
    assert (await http.get("/api/v1/resources/queues", headers=cross)).status_code == 200
    assert (await http.get("/", headers={"sec-fetch-site": "cross-site"})).status_code == 200  # a link to the UI


async def test_origins_listed_for_cors_may_write_cross_site(start_broker: Any) -> None:
    b: Broker = await start_broker(cors_origins="https://app.test")
    async with httpx.AsyncClient(base_url=b.url) as http:
        ok = {"sec-fetch-site": "cross-site", "origin": "https://app.test"}
        assert (await http.post("/api/v1/stats/refresh", headers=ok)).status_code == 200
        assert (await http.post("/api/v1/stats/refresh", headers={"origin": "https://app.test"})).status_code == 200
        r = await http.post("/api/v1/stats/refresh", headers={**ok, "origin": "https://evil.test"})
        assert r.status_code == 403


async def test_a_rebound_host_name_changes_nothing(http: httpx.AsyncClient) -> None:
    """DNS rebinding: evil.example resolves to 127.0.0.1, so the page is same-origin to itself and its
    requests carry Host: evil.example (and Sec-Fetch-Site: same-origin)."""
    await push(http, "rb", [{"payload": 1}])
    rebound = {"host": "evil.example:6632", "sec-fetch-site": "same-origin", "origin": "http://evil.example:6632"}
    r = await http.delete("/api/v1/resources/queues/rb", headers=rebound)
    assert r.status_code == 400 and r.json()["code"] == "bad_host", r.text
    r = await http.post("/api/v1/system/maintenance", json={"enabled": True}, headers=rebound)
    assert r.status_code == 400 and r.json()["code"] == "bad_host"
    r = await http.get("/api/v1/resources/queues", headers=rebound)  # reads too: the page could read them
    assert r.status_code == 400
    assert (await http.get("/api/v1/resources/queues/rb")).status_code == 200
    assert (await http.get("/api/v1/system/maintenance")).json()["maintenanceMode"] is False


@pytest.mark.parametrize("host", ["localhost", "localhost:6632", "127.0.0.1", "[::1]:80", "queen.localhost:1", "[::1]"])
async def test_loopback_names_are_accepted_by_default(http: httpx.AsyncClient, host: str) -> None:
    assert (await http.get("/api/v1/resources/queues", headers={"host": host})).status_code == 200


async def test_a_request_without_host_is_accepted(broker: Broker) -> None:
    """HTTP/1.0 health checks (HAProxy's `option httpchk`) send no Host; no browser does."""
    reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
    writer.write(b"GET /health HTTP/1.0\r\n\r\n")
    await writer.drain()
    head = await reader.readline()
    writer.close()
    assert head.startswith(b"HTTP/1.1 200"), head


async def test_allowed_hosts_star_accepts_any_host(start_broker: Any) -> None:
    b: Broker = await start_broker(allowed_hosts="*")
    async with httpx.AsyncClient(base_url=b.url) as http:
        assert (await http.get("/health", headers={"host": "evil.example"})).status_code == 200


async def test_wildcard_bind_accepts_addresses_and_plain_names_only(
    start_broker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Bound to 0.0.0.0 (a container): IP literals (a rebinding needs a name), loopback, single-label
    names (a compose service, the container's hostname: no public DNS serves them); other names 400."""
    with caplog.at_level(logging.WARNING, logger="queen_pg.security"):
        b: Broker = await start_broker(host="0.0.0.0")
    assert any("event=allowed_hosts_default" in r.getMessage() for r in caplog.records)
    async with httpx.AsyncClient(base_url=b.url) as http:
        for host in ("10.1.2.3:6632", "[fd00::1]:6632", "queen:6632", "localhost", socket.gethostname()):
            assert (await http.get("/health", headers={"host": host})).status_code == 200, host
        for host in ("evil.example", "evil.example:6632", "queen.example.com"):
            r = await http.get("/health", headers={"host": host})
            assert r.status_code == 400 and r.json()["code"] == "bad_host", host


@pytest.mark.parametrize("path", ["/", "/dashboard/index.html", "/docs", "/redoc"])
async def test_pages_refuse_to_be_framed(http: httpx.AsyncClient, path: str) -> None:
    r = await http.get(path)
    assert r.status_code == 200
    assert r.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]


async def test_tenant_from_header_with_jwt_but_no_claim_is_logged(
    start_broker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="queen_pg.security"):
        await start_broker(tenancy_header=True, jwt_enabled=True, jwt_secret="s" * 40)
    lines = [r.getMessage() for r in caplog.records if "event=tenant_header_unbound" in r.getMessage()]
    assert len(lines) == 1, lines
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="queen_pg.security"):
        await start_broker(tenancy_header=True, jwt_enabled=True, jwt_secret="s" * 40, jwt_tenant_claim="tenant")
    assert not any("event=tenant_header_unbound" in r.getMessage() for r in caplog.records)


def test_open_bind_without_jwt_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    for host, logged in (("0.0.0.0", True), ("10.1.2.3", True), ("127.0.0.1", False), ("localhost", False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="queen_pg.security"):
            create_app(Settings(database_url="postgresql://x/y", host=host))
        lines = [r.getMessage() for r in caplog.records if "event=open_bind" in r.getMessage()]
        assert bool(lines) is logged, (host, lines)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="queen_pg.security"):
        create_app(Settings(database_url="postgresql://x/y", host="0.0.0.0", jwt_enabled=True, jwt_secret="s" * 40))
    assert not any("event=open_bind" in r.getMessage() for r in caplog.records)


BROWSER_UA = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/150.0.0.0 Safari/537.36"


@pytest.mark.parametrize(
    "headers",
    [
        # what chromium sends to http://<lan-ip> (no Fetch Metadata, no Origin), per kind of request
        {"user-agent": BROWSER_UA, "accept": "image/avif,image/webp,image/apng,image/svg+xml,image/*,*/*;q=0.8"},
        {"user-agent": BROWSER_UA, "accept": "*/*"},  # <script src>, fetch(url, {mode: "no-cors"})
        {"user-agent": BROWSER_UA, "accept": "text/html,application/xhtml+xml,*/*;q=0.8"},  # iframe, form GET
        {"user-agent": BROWSER_UA, "accept": "application/json"},  # fetch may pick any Accept, not the UA
        {"user-agent": "Mozilla/5.0 (Macintosh) Gecko/20100101 Firefox/140.0", "accept": "*/*"},
        {"user-agent": "SomeWebView/1", "accept": "image/png"},  # an image asked for, whatever the UA
    ],
)
async def test_a_pop_that_looks_like_a_browser_and_names_no_origin_is_refused(
    http: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    await push(http, "lan", [{"payload": i, "transactionId": f"lan-{i}"} for i in range(3)])
    for path in ("/api/v1/pop/queue/lan", "/api/v1/pop/queue/lan/partition/Default", "/api/v1/pop"):
        for auto_ack in ("true", "false"):
            r = await http.get(path, params={"autoAck": auto_ack, "wait": "false", "batch": "100"}, headers=headers)
            assert r.status_code == 403, (path, r.status_code, r.text)
            assert r.json()["code"] == "cross_site"
            assert "Origin" in r.json()["error"]
    # nothing acked, nothing leased
    got = await pop(http, "lan", wait=False, batch=100)
    assert sorted(m["transactionId"] for m in got["messages"]) == ["lan-0", "lan-1", "lan-2"]


async def test_clients_that_are_not_browsers_and_browser_reads_still_pass(
    http: httpx.AsyncClient, start_broker: Any
) -> None:
    for i, headers in enumerate(
        [
            {},  # httpx's own headers: the official clients (queen-mq 2.6.0 and 0.15 send no others on a pop)
            {"user-agent": "curl/8.5.0", "accept": "*/*"},
            {"user-agent": "python-requests/2.32", "accept": "application/json"},
            {"user-agent": BROWSER_UA, "origin": str(http.base_url).rstrip("/")},  # the broker's own origin
            {"user-agent": BROWSER_UA, "sec-fetch-site": "none"},  # the operator typed the URL on loopback
        ]
    ):
        await push(http, f"np{i}", [{"payload": i}])
        r = await http.get(f"/api/v1/pop/queue/np{i}", params={"wait": "false", "autoAck": "true"}, headers=headers)
        assert r.status_code == 200, (headers, r.text)
    # a browser's reads and a browser's POST (which always names its Origin) are not pop GETs
    browser = {"user-agent": BROWSER_UA, "accept": "text/html,*/*"}
    assert (await http.get("/api/v1/resources/queues", headers=browser)).status_code == 200
    assert (await http.get("/", headers=browser)).status_code == 200
    own = {**browser, "origin": str(http.base_url).rstrip("/"), "content-type": "application/json"}
    assert (await http.post("/api/v1/stats/refresh", headers=own)).status_code == 200
    # a CORS request from a listed origin carries its Origin and may pop
    b: Broker = await start_broker(cors_origins="https://app.test")
    async with httpx.AsyncClient(base_url=b.url) as other:
        await push(other, "cors", [{"payload": 1}])
        r = await other.get(
            "/api/v1/pop/queue/cors",
            params={"wait": "false"},
            headers={"user-agent": BROWSER_UA, "origin": "https://app.test"},
        )
        assert r.status_code == 200, r.text
