"""The security layer's face to the app: installing the middleware, and what a route may ask of it
(the caller, its level). Kept out of the package ``__init__`` so that importing ``queen_pg.security.crypto``
(the engine does) loads no web framework."""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.middleware.cors import CORSMiddleware

from queen_pg.errors import FORBIDDEN, QueenError
from queen_pg.security.middleware import STATE_KEY, Checks, Principal, Security
from queen_pg.security.roles import Level
from queen_pg.security.web import split_list
from queen_pg.settings import Settings

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


def need(request: Request, level: Level) -> None:
    """403 unless the caller's level reaches ``level`` (for a route whose body decides, e.g. KV writes)."""
    p = principal(request)
    if p is not None and p.level < level:
        raise QueenError(FORBIDDEN, detail=f"this operation needs the {level.label} level")
