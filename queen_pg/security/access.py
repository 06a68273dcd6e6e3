"""The security layer's face to the app: installing the middleware, and what a route may ask of it
(the caller, its level). Kept out of the package ``__init__`` so that importing ``queen_pg.security.crypto``
(the engine does) loads no web framework."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import BaseRoute, Route

from queen_pg.errors import FORBIDDEN, QueenError
from queen_pg.security.middleware import STATE_KEY, Checks, Principal, Security
from queen_pg.security.roles import Level, RouteLevels
from queen_pg.security.web import split_list
from queen_pg.settings import Settings

Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])
LEVEL_ATTR = "queen_level"

CORS_HEADERS = ["Authorization", "Content-Type", "x-queen-tenant", "Idempotency-Key", "X-Request-Id"]


def install(app: FastAPI, settings: Settings) -> Checks:
    """Add the security middleware (inside it: the app's own; outside: CORS when configured); its rules
    are returned for the protocol-level data plane (queen_pg/api/hot.py), which applies the same ones."""
    checks = Checks(settings)
    app.add_middleware(Security, checks=checks)
    origins = split_list(settings.cors_origins)
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "PUT", "DELETE", "OPTIONS"],
            allow_headers=CORS_HEADERS,
            allow_credentials=False,
            max_age=600,
        )
    return checks


def principal(request: Request) -> Principal | None:
    p: Principal | None = request.scope.get("state", {}).get(STATE_KEY)
    return p


def reaches(request: Request, level: Level) -> bool:
    """Whether the caller's level reaches ``level`` (always, with JWT off)."""
    p = principal(request)
    return p is None or p.level >= level


def need(request: Request, level: Level) -> None:
    """403 unless the caller's level reaches ``level`` (for a route whose body decides, e.g. KV writes)."""
    if not reaches(request, level):
        raise QueenError(FORBIDDEN, detail=f"this operation needs the {level.label} level")


def level(least: Level) -> Callable[[Endpoint], Endpoint]:
    """Declares a route's level beside the route: under ``@router.get(...)``, ``@level(Level.READ_ONLY)``
    marks the endpoint with the least level that may call it (docs/architecture.md#security)."""

    def mark(endpoint: Endpoint) -> Endpoint:
        endpoint.__dict__[LEVEL_ATTR] = least
        return endpoint

    return mark


def route_levels(routes: Iterable[BaseRoute], extra: RouteLevels) -> dict[tuple[str, str], Level]:
    """The (method, path template) -> level table of ``routes`` (their endpoints' ``@level``, else
    ``extra``: the routes the app gets from FastAPI itself). A route with neither is a ValueError: a
    route cannot ship without a level."""
    table: dict[tuple[str, str], Level] = {}
    missing: list[tuple[str, str]] = []
    for route in routes:
        if not isinstance(route, Route):
            continue
        for method in sorted(route.methods or ()):
            if method == "HEAD":
                continue  # HEAD is GET (RouteTable.level)
            key = (method, route.path)
            found: Level | None = route.endpoint.__dict__.get(LEVEL_ATTR, extra.get(key))
            if found is None:
                missing.append(key)
            else:
                table[key] = found
    if missing:
        raise ValueError(f"routes without an access level (@queen_pg.security.access.level): {missing}")
    return table


def declare_routes(app: FastAPI, checks: Checks, extra: RouteLevels) -> None:
    """Hands the app's route levels to its security checks (called once the routes are in)."""
    checks.declare(route_levels(app.routes, extra))
