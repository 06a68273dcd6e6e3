"""Access levels: the levels, the route -> level matcher, and the levels a token's roles grant.

Each route's level is declared beside the route, in its feature's module (``@access.level(...)`` on
the endpoint); the app collects them when it is built and hands the table to its security checks
(``access.declare_routes``), so security imports no route and holds no process-wide table. A route
with no level fails the build (tests/test_security_roles.py). A request to a path no entry matches
needs a valid token (any level) and then gets the router's 404/405.

Levels: read-only < read-write < admin. Read-only: reads (status, resources, messages, DLQ list,
traces, consumer-group listings, KV get). Read-write: push, pop, ack, lease, transaction, KV writes,
locks, timers, configure, trace records. Admin: deletes, seek, DLQ requeue/move, maintenance, clear,
the subscription reset and the stats refresh, and a configure that weakens an existing queue (decided
by its procedure against the stored options: the route passes whether the caller reaches admin).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from starlette.routing import compile_path

if TYPE_CHECKING:
    from queen_pg.settings import Settings


class Level(IntEnum):
    NONE = 0
    READ_ONLY = 1
    READ_WRITE = 2
    ADMIN = 3

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")


R, W, A = Level.READ_ONLY, Level.READ_WRITE, Level.ADMIN

RouteLevels = Mapping[tuple[str, str], Level]
"""(method, path template) -> the least level that may call it. HEAD is GET."""


# Paths under these prefixes are static files shipped in the package (the dashboard's modules, the
# Swagger UI bundle): they hold no data, so a browser may load them before it has a token. The data
# they show comes from the API routes, each behind its level.
PUBLIC_PREFIXES = ("/dashboard/", "/docs/assets/")


class RouteTable:
    """The app's route levels (``security.access.declare_routes`` hands them over once the routes are
    in) compiled for matching raw request paths (Starlette's own path compiler)."""

    def __init__(self, routes: RouteLevels) -> None:
        self.routes = dict(routes)
        # GET routes that change state (a pop leases, or acks with autoAck): the path prefixes of those
        # that need read-write (security/web.py refuses them cross-site)
        self.write_gets = tuple(
            sorted(
                {path.split("{", 1)[0] for (method, path), level in routes.items() if method == "GET" and level >= W}
            )
        )
        by_method: dict[str, list[tuple[re.Pattern[str], Level]]] = {}
        # literal segments before parameters: /consumer-groups/lagging beats /consumer-groups/{group}
        for (method, path), level in sorted(routes.items(), key=lambda kv: kv[0][1].count("{")):
            regex, _fmt, _conv = compile_path(path)
            by_method.setdefault(method, []).append((regex, level))
        self._by_method = by_method

    def level(self, method: str, path: str) -> Level | None:
        """The route's level, or None when no entry matches (the router answers 404/405). Entries keep
        their ``:path`` converters, so a transactionId or timer key with a ``/`` matches its route."""
        for regex, level in self._by_method.get("GET" if method == "HEAD" else method, ()):
            if regex.match(path):
                return level
        return None


def granted(settings: Settings, claims: dict[str, Any]) -> Level:
    """The highest level among the token's roles (JWT_ROLES_CLAIM: a string, JWT_ROLES_ARRAY_CLAIM: a
    list); a token with no known role gets none (authenticated, 403 everywhere)."""
    roles: list[Any] = []
    for name in (settings.jwt_roles_claim, settings.jwt_roles_array_claim):
        value = claims.get(name) if name else None
        if isinstance(value, str):
            roles.append(value)
        elif isinstance(value, Iterable) and not isinstance(value, bytes | dict):
            roles.extend(value)
    names = {
        settings.jwt_role_admin: Level.ADMIN,
        settings.jwt_role_read_write: Level.READ_WRITE,
        settings.jwt_role_read_only: Level.READ_ONLY,
    }
    return max((names.get(r, Level.NONE) for r in roles if isinstance(r, str)), default=Level.NONE)
