"""The route -> level table: every route of the app has a level, declared beside the route
(``@queen_pg.security.access.level``), and the app hands the whole table to the security middleware."""

from __future__ import annotations

import fastapi.routing
import pytest
from fastapi import APIRouter, FastAPI

from queen_pg.app import DOC_PAGES, create_app
from queen_pg.security.access import level, route_levels
from queen_pg.security.roles import Level, RouteTable
from queen_pg.settings import Settings


def app_routes(app: FastAPI) -> set[tuple[str, str]]:
    iter_contexts = getattr(fastapi.routing, "iter_route_contexts", None)
    if iter_contexts is None:
        pairs = [(r.path, r.methods) for r in app.routes]  # with :path converters
    else:
        pairs = [(c.path, c.methods) for c in iter_contexts(app.routes)]
    return {(m, path) for path, methods in pairs for m in (methods or ()) if m != "HEAD"}


def test_every_route_has_a_level_and_the_table_names_no_ghosts() -> None:
    app = create_app(Settings(database_url="postgresql://unused/x"))
    routes, declared = app_routes(app), app.state.checks.table.routes
    assert len(routes) > 50
    missing = sorted(routes - declared.keys())
    assert missing == [], f"routes without an access level (@level beside the route): {missing}"
    ghosts = sorted(declared.keys() - routes)
    assert ghosts == [], f"levels for routes the app does not have: {ghosts}"


def test_a_route_with_no_level_fails_the_build() -> None:
    router = APIRouter()

    @router.get("/marked")
    @level(Level.READ_ONLY)
    async def marked() -> None: ...

    @router.post("/unmarked")
    async def unmarked() -> None: ...

    with pytest.raises(ValueError, match=r"without an access level.*\('POST', '/unmarked'\)"):
        route_levels(router.routes, DOC_PAGES)
    assert route_levels(router.routes[:1], {}) == {("GET", "/marked"): Level.READ_ONLY}


def test_route_table_matching() -> None:
    t = create_app(Settings(database_url="postgresql://unused/x")).state.checks.table  # declared by create_app
    assert isinstance(t, RouteTable)
    assert t.level("GET", "/api/v1/consumer-groups/lagging") == Level.READ_ONLY
    assert t.level("DELETE", "/api/v1/consumer-groups/g") == Level.ADMIN
    assert t.level("HEAD", "/api/v1/resources/queues") == Level.READ_ONLY
    assert t.level("POST", "/api/v1/consumer-groups/g/queues/q/partitions/p/seek") == Level.ADMIN
    assert t.level("GET", "/api/v1/pop/queue/a%2Fb") == Level.READ_WRITE
    assert t.level("POST", "/api/v1/resources/queues") is None  # no such route: any valid token, then 405
    assert t.level("GET", "/openapi.json") == Level.READ_ONLY  # FastAPI's own route: DOC_PAGES
