"""The one route -> access level table, and the levels a token's roles grant.

Every route of the app is in ``ROUTES`` (tests/test_security_roles.py enumerates ``app.routes`` and
fails on a route missing here, so a new route cannot ship without a level). A request to a path no
entry matches needs a valid token (any level) and then gets the router's 404/405.

Levels: read-only < read-write < admin. Read-only: reads (status, resources, messages, DLQ list,
traces, consumer-group listings, KV get). Read-write: push, pop, ack, lease, transaction, KV writes,
locks, timers, configure, trace records. Admin: deletes, seek, DLQ requeue/move, maintenance, clear,
the subscription reset and the stats refresh.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
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

# (method, path template) -> the least level that may call it. HEAD is GET.
ROUTES: dict[tuple[str, str], Level] = {
    # data plane
    ("POST", "/api/v1/push"): W,
    ("GET", "/api/v1/pop"): W,
    ("GET", "/api/v1/pop/queue/{queue}"): W,
    ("GET", "/api/v1/pop/queue/{queue}/partition/{partition}"): W,
    ("POST", "/api/v1/ack"): W,
    ("POST", "/api/v1/ack/batch"): W,
    ("POST", "/api/v1/lease/{lease_id}/extend"): W,
    ("POST", "/api/v1/transaction"): W,
    ("POST", "/api/v1/configure"): W,
    # KV reads are read-only; a body holding a write op needs read-write (the route asks need())
    ("POST", "/api/v1/kv"): R,
    ("POST", "/api/v1/locks"): W,
    ("POST", "/api/v1/timers"): W,
    ("DELETE", "/api/v1/timers/{target:path}"): W,
    ("GET", "/api/v1/timers/{target:path}"): R,
    ("POST", "/api/v1/traces"): W,
    # reads
    ("GET", "/api/v1/resources/overview"): R,
    ("GET", "/api/v1/resources/queues"): R,
    ("GET", "/api/v1/resources/queues/{queue}"): R,
    ("GET", "/api/v1/resources/queues/{queue}/depth"): R,
    ("GET", "/api/v1/resources/partitions"): R,
    ("GET", "/api/v1/resources/namespaces"): R,
    ("GET", "/api/v1/resources/tasks"): R,
    ("GET", "/api/v1/consumer-groups"): R,
    ("GET", "/api/v1/consumer-groups/lagging"): R,
    ("GET", "/api/v1/consumer-groups/{group}"): R,
    ("GET", "/api/v1/messages"): R,
    ("GET", "/api/v1/messages/{partition_id}/{transaction_id:path}"): R,
    ("GET", "/api/v1/dlq"): R,
    ("GET", "/api/v1/traces/names"): R,
    ("GET", "/api/v1/traces/by-name/{name}"): R,
    ("GET", "/api/v1/traces/{partition_id}/{transaction_id:path}"): R,
    ("GET", "/api/v1/system/maintenance"): R,
    ("GET", "/api/v1/system/maintenance/pop"): R,
    ("GET", "/api/v1/status"): R,
    ("GET", "/api/v1/status/queues"): R,
    ("GET", "/api/v1/status/queues/{queue}"): R,
    ("GET", "/api/v1/status/analytics"): R,
    ("GET", "/api/v1/analytics/system-metrics"): R,
    ("GET", "/api/v1/analytics/worker-metrics"): R,
    ("GET", "/health"): R,
    ("GET", "/metrics"): R,
    ("GET", "/metrics/queues"): R,
    ("GET", "/api/v1/kv/namespaces"): R,
    ("GET", "/api/v1/kv/keys"): R,
    # static files (the dashboard's code, Swagger UI): no data, served without a token (PUBLIC_PREFIXES)
    ("GET", "/"): R,
    ("GET", "/dashboard/{name:path}"): R,
    ("GET", "/docs/assets/{name}"): R,
    ("GET", "/openapi.json"): R,
    ("GET", "/docs"): R,
    ("GET", "/redoc"): R,
    # admin
    ("DELETE", "/api/v1/resources/queues/{queue}"): A,
    ("DELETE", "/api/v1/queues/{queue}/clear"): A,
    ("DELETE", "/api/v1/messages/{partition_id}/{transaction_id:path}"): A,
    ("POST", "/api/v1/messages/{partition_id}/{transaction_id:path}/retry"): A,
    ("POST", "/api/v1/messages/{partition_id}/{transaction_id:path}/dlq"): A,
    ("DELETE", "/api/v1/consumer-groups/{group}"): A,
    ("DELETE", "/api/v1/consumer-groups/{group}/queues/{queue}"): A,
    ("POST", "/api/v1/consumer-groups/{group}/queues/{queue}/seek"): A,
    ("POST", "/api/v1/consumer-groups/{group}/queues/{queue}/partitions/{partition}/seek"): A,
    ("POST", "/api/v1/consumer-groups/{group}/subscription"): A,
    ("POST", "/api/v1/system/maintenance"): A,
    ("POST", "/api/v1/system/maintenance/pop"): A,
    ("POST", "/api/v1/stats/refresh"): A,
}


# Paths under these prefixes are static files shipped in the package (the dashboard's modules, the
# Swagger UI bundle): they hold no data, so a browser may load them before it has a token. The data
# they show comes from the API routes above, each behind its level.
PUBLIC_PREFIXES = ("/dashboard/", "/docs/assets/")


class RouteTable:
    """``ROUTES`` compiled for matching raw request paths (Starlette's own path compiler)."""

    def __init__(self, routes: dict[tuple[str, str], Level] = ROUTES) -> None:
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
