"""Pure-ASGI middleware that runs before every route: Host check, cross-site, JWT, tenant, Content-Type.

The rules are :meth:`Checks.admit`, one call shared by the ASGI middleware :class:`Security`, which wraps
every route, and the data plane answered from the HTTP protocol (queen_pg/api/hot.py). Order inside
one request: a foreign ``Host`` is 400; a browser request from another site that would change state
is 403 ``cross_site`` (both decided in queen_pg/security/web.py); then (JWT on, path not skipped) a missing,
invalid or expired token is 401 with ``WWW-Authenticate: Bearer`` and a valid token below the
route's level (queen_pg/security/roles.py) is 403; then the tenant is resolved (400/403,
queen_pg/security/tenancy.py); each of those refusals carries ``Connection: close``; then a
state-changing request whose Content-Type is not JSON (or the binary push type), or that has a body
but no Content-Type, is 415. What was resolved goes into ``scope["state"]`` (``queen_principal``),
where ``queen_pg.api.common.tenant()``, ``security.need()`` and the server's connection cap
(queen_pg/server.py) read it. Errors are JSON ``{"error", "code"}`` and never echo the token.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from queen_pg.errors import (
    BAD_HOST,
    BAD_REQUEST,
    CROSS_SITE,
    FORBIDDEN,
    UNAUTHORIZED,
    UNSUPPORTED_MEDIA_TYPE,
    ErrorKind,
)
from queen_pg.security.roles import PUBLIC_PREFIXES, Level, RouteLevels, RouteTable, granted
from queen_pg.security.tenancy import HEADER, TenantError, resolve
from queen_pg.security.tenancy import enabled as tenancy_enabled
from queen_pg.security.tokens import TokenError, Verifier
from queen_pg.security.web import HostPolicy, cross_site, loopback_bind, split_list
from queen_pg.settings import Settings

log = logging.getLogger("queen_pg.security")

STATE_KEY = "queen_principal"
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
BINARY_PUSH = "application/x-queen-push"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the token's ``sub`` (None without JWT), its level, and the tenant."""

    sub: str | None
    level: Level
    tenant: str
    authenticated: bool


def json_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media in ("application/json", BINARY_PUSH) or (media.startswith("application/") and media.endswith("+json"))


async def _error(send: Send, kind: ErrorKind, detail: str, headers: dict[str, str] | None = None) -> None:
    # an audit line per refusal: the reason and the status, never the token or a header value
    log.info("event=request_refused status=%d code=%s detail=%s", kind.status, kind.code, detail)
    body = orjson.dumps({"error": detail, "code": kind.code})
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if kind.status != 415:
        # refused before it was admitted (Host, cross-site, token, level, tenant): the connection closes
        # after the answer, so a client without a valid token holds no place under QUEEN_MAX_CONNECTIONS
        # (queen_pg/server.py); a 415 comes after the principal was resolved and keeps it
        raw.append((b"connection", b"close"))
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": kind.status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


_WANTED = frozenset(
    {
        b"host",
        b"authorization",
        b"content-type",
        b"content-length",
        b"transfer-encoding",
        b"origin",
        b"sec-fetch-site",
        b"user-agent",
        b"accept",
        HEADER.encode(),
    }
)


def _headers(scope: Scope) -> dict[bytes, str]:
    """The few headers this middleware reads, in one pass (the first of each; ASGI names are lowercase)."""
    found: dict[bytes, str] = {}
    for key, value in scope["headers"]:
        if key in _WANTED and key not in found:
            found[key] = value.decode("latin-1")
    return found


class Checks:
    """The rules every request passes before its route (the module doc), as one call: the ASGI middleware
    (:class:`Security`) and the protocol-level data plane (queen_pg/api/hot.py) share this instance."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._table: RouteTable | None = None  # create_app declares the levels once the routes are in
        self.skip = frozenset(split_list(settings.jwt_skip_paths))
        self.hosts = HostPolicy(settings)
        self.hosts.log_start()
        self.origins = frozenset(split_list(settings.cors_origins))
        if settings.jwt_enabled and settings.tenancy_header and not settings.jwt_tenant_claim:
            log.warning(
                "event=tenant_header_unbound detail=QUEEN_TENANCY_HEADER=1 with JWT_ENABLED=1 and no "
                "JWT_TENANT_CLAIM: any valid token may act in any tenant it names in x-queen-tenant; "
                "set JWT_TENANT_CLAIM to bind tokens to their tenant"
            )
        if not settings.jwt_enabled and not loopback_bind(settings.host):
            log.warning(
                "event=open_bind bind=%s detail=JWT is off and the broker listens beyond loopback: anyone who "
                "reaches the port may do everything, and a browser there sends no Fetch Metadata (pops that look "
                "like a browser's are refused, other reads answer); set JWT_ENABLED=1 or keep a network boundary "
                "in front",
                settings.host or "*",
            )
        self.verifier = Verifier.build(settings) if settings.jwt_enabled else None
        # nothing to resolve (no JWT, one tenant): every request is the same principal
        self.fixed = (
            None if settings.jwt_enabled or tenancy_enabled(settings)
            else Principal(None, Level.ADMIN, settings.default_tenant, False)
        )  # fmt: skip

    def declare(self, routes: RouteLevels) -> None:
        """The app's route levels (``security.access.declare_routes``), before the first request."""
        self._table = RouteTable(routes)

    @property
    def table(self) -> RouteTable:
        if self._table is None:
            raise RuntimeError("no route levels declared: create_app hands them over (queen_pg/security/access.py)")
        return self._table

    async def admit(self, scope: Scope, send: Send) -> bool:
        """True: the request may go on, its principal is in ``scope["state"]``; False: it was refused and
        the answer is sent."""
        headers = _headers(scope)
        host = headers.get(b"host")
        if not self.hosts.allows(host):
            await _error(send, BAD_HOST, "Host header not allowed (QUEEN_ALLOWED_HOSTS lists the accepted names)")
            return False
        method: str = scope["method"]
        refused = cross_site(
            method,
            scope["path"],
            headers.get(b"sec-fetch-site"),
            headers.get(b"origin"),
            host,
            self.origins,
            self.table.write_gets,
            headers.get(b"user-agent"),
            headers.get(b"accept"),
        )
        if refused is not None:
            await _error(send, CROSS_SITE, refused)
            return False
        principal = self.fixed or await self._resolve(scope, method, headers, send)
        if principal is None:
            return False  # refused: the answer is sent
        if method in STATE_CHANGING:
            ctype = headers.get(b"content-type")
            has_body = headers.get(b"content-length", "0") not in ("0", "") or b"transfer-encoding" in headers
            if (ctype is not None and not json_type(ctype)) or (ctype is None and has_body):
                await _error(send, UNSUPPORTED_MEDIA_TYPE, f"Content-Type must be application/json or {BINARY_PUSH}")
                return False
        scope.setdefault("state", {})[STATE_KEY] = principal
        return True

    async def _resolve(self, scope: Scope, method: str, headers: dict[bytes, str], send: Send) -> Principal | None:
        """Token, level and tenant; None when the request was refused (401/403/400 sent)."""
        path: str = scope["path"]
        claims: dict[str, Any] | None = None
        level = Level.ADMIN  # JWT off: everyone may do everything
        if self.verifier is not None:
            level = Level.NONE
            token = _bearer(headers.get(b"authorization"))
            skipped = path in self.skip or path.startswith(PUBLIC_PREFIXES)
            if token is None and not skipped:
                await _error(send, UNAUTHORIZED, "missing bearer token", {"WWW-Authenticate": "Bearer"})
                return None
            if token is not None:
                try:
                    claims = await self.verifier.verify(token)
                except TokenError as exc:
                    if not skipped:
                        await _error(send, UNAUTHORIZED, str(exc), {"WWW-Authenticate": 'Bearer error="invalid_token"'})
                        return None
                else:
                    level = granted(self.settings, claims)
            if not skipped:
                # no entry: a read needs any valid token; a write fails closed (admin), so a route the
                # table does not know can never be a way around it
                need = self.table.level(method, path) or (Level.ADMIN if method in STATE_CHANGING else Level.READ_ONLY)
                if level < need:
                    detail = f"this route needs the {need.label} level; the token grants {level.label}"
                    await _error(send, FORBIDDEN, detail)
                    return None
        try:
            if tenancy_enabled(self.settings) and _repeated(scope, _TENANT_KEY):
                # which one counts would be a guess: a proxy that appends its own after the client's
                # would otherwise leave the client's (the first) in charge
                raise TenantError(400, f"{HEADER} is given more than once; send exactly one")
            tenant = resolve(self.settings, headers.get(_TENANT_KEY), claims)
        except TenantError as exc:
            await _error(send, FORBIDDEN if exc.status == 403 else BAD_REQUEST, str(exc))
            return None
        sub = claims.get("sub") if claims is not None else None
        return Principal(sub if isinstance(sub, str) else None, level, tenant, claims is not None)


_TENANT_KEY = HEADER.encode()


def _repeated(scope: Scope, name: bytes) -> bool:
    seen = False
    for key, _ in scope["headers"]:
        if key == name:
            if seen:
                return True
            seen = True
    return False


def _bearer(value: str | None) -> str | None:
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class Security:
    """Pure ASGI: :meth:`Checks.admit`, then the app."""

    def __init__(self, app: ASGIApp, checks: Checks) -> None:
        self.app = app
        self.checks = checks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or await self.checks.admit(scope, send):
            await self.app(scope, receive, send)
