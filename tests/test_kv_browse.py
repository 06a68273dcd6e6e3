"""The read-only routes behind the dashboard's KV page, and the dashboard's files being served."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx

from queen_pg.db.pool import Database
from queen_pg.engine import kv as kv_engine


async def _put(http: httpx.AsyncClient, ns: str, key: str, value: object, **extra: object) -> None:
    op = {"op": "put", "ns": ns, "key": key, "value": value, **(extra or {"forever": True})}
    r = await http.post("/api/v1/kv", json={"operations": [op]})
    assert r.status_code == 200 and r.json()["results"][0]["applied"] is True, r.text


async def test_namespaces_page_in_order(http: httpx.AsyncClient) -> None:
    for ns in ("c", "a", "b"):
        for k in ("k1", "k2", "k3"):  # several keys per namespace: listed once
            await _put(http, ns, k, 1)
    assert (await http.get("/api/v1/kv/namespaces")).json() == {
        "namespaces": ["a", "b", "c"],
        "truncated": False,
        "nextAfter": None,
    }
    first = (await http.get("/api/v1/kv/namespaces", params={"limit": 2})).json()
    assert first == {"namespaces": ["a", "b"], "truncated": True, "nextAfter": "b"}
    rest = (await http.get("/api/v1/kv/namespaces", params={"limit": 2, "after": "b"})).json()
    assert rest == {"namespaces": ["c"], "truncated": False, "nextAfter": None}
    for bad in ({"limit": 0}, {"limit": 1001}, {"limit": "x"}):
        r = await http.get("/api/v1/kv/namespaces", params=bad)
        assert r.status_code == 400 and r.json()["code"] == "bad_request", r.text


async def test_keys_with_an_empty_prefix_lists_the_namespace(http: httpx.AsyncClient) -> None:
    await _put(http, "orders", "order-2", {"s": "new"})
    await _put(http, "orders", "order-1", {"s": "paid"}, ttlSeconds=60)
    await _put(http, "orders", "zeta", 3)
    await _put(http, "other", "order-9", 9)
    page = (await http.get("/api/v1/kv/keys", params={"ns": "orders", "limit": 2})).json()
    assert [r["key"] for r in page["rows"]] == ["order-1", "order-2"]
    assert page["rows"][0]["value"] == {"s": "paid"} and page["rows"][0]["expiresAt"] is not None
    assert page["truncated"] is True and page["nextAfter"] == "order-2"
    rest = (await http.get("/api/v1/kv/keys", params={"ns": "orders", "after": "order-2"})).json()
    assert [r["key"] for r in rest["rows"]] == ["zeta"] and rest["truncated"] is False
    only = (await http.get("/api/v1/kv/keys", params={"ns": "orders", "prefix": "order-", "keysOnly": "true"})).json()
    assert [r["key"] for r in only["rows"]] == ["order-1", "order-2"] and "value" not in only["rows"][0]
    r = await http.get("/api/v1/kv/keys")
    assert r.status_code == 400 and "ns" in r.json()["error"]
    r = await http.get("/api/v1/kv/keys", params={"ns": "orders", "keysOnly": "maybe"})
    assert r.status_code == 400


async def test_expired_keys_are_not_listed(db: Database) -> None:
    now = datetime.now(UTC)
    await kv_engine.apply(db, "t", [{"op": "put", "ns": "n", "key": "short", "value": 1, "ttlSeconds": 10}], now=now)
    await kv_engine.apply(db, "t", [{"op": "put", "ns": "n", "key": "long", "value": 2, "forever": True}], now=now)
    later = await kv_engine.keys(db, "t", "n", "", None, 10, False, now=now + timedelta(seconds=11))
    assert [r["key"] for r in later["rows"]] == ["long"]
    assert [r["key"] for r in (await kv_engine.keys(db, "t", "n", "", None, 10, False, now=now))["rows"]] == [
        "long",
        "short",
    ]
    assert (await kv_engine.namespaces(db, "other-tenant", None, 10))["namespaces"] == []


async def test_the_dashboard_files_are_served(http: httpx.AsyncClient) -> None:
    r = await http.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert 'type="importmap"' in r.text and "dashboard/js/app.js" in r.text
    js = await http.get("/dashboard/js/app.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert js.headers["cache-control"] == "no-cache"
    assert (await http.head("/dashboard/vendor/uPlot.min.css")).status_code == 200
    for bad in ("/dashboard/nope.js", "/dashboard/%2e%2e/pyproject.toml", "/dashboard/vendor/LICENSE.uplot"):
        r = await http.get(bad)
        assert r.status_code == 404 and r.json()["code"] == "not_found", bad
