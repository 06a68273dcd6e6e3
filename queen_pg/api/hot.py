"""The data plane's routes served without FastAPI's router, and (by default) from the HTTP protocol itself.

FastAPI spends ~55 µs of CPU per request on a trivial route before the endpoint runs (its route-table
version walk, exception and exit-stack middleware, dependency solving: measured in-process, against
~14 µs for Starlette's router and ~5 µs for a bare ASGI call); for a 1-item push that is a sixth of
the broker's work. The hot routes (push, pop, ack, ack/batch, lease extend, transaction) take only
the ``Request`` and their path parameters, so they are matched here (:class:`HotTable`: the routes' own
``matches``, same path templates, same convertors, same ``scope["route"]`` for the metrics label) and
their endpoint awaited (:func:`serve`). Every route stays registered and documented in FastAPI.

Two ways in:

- :class:`HotPath` (``QUEEN_HOT_PROTOCOL=1``, the default): the server's protocol (queen_pg/server.py)
  asks :meth:`HotPath.app_for` when a request's head is parsed, and runs what it returns in place of
  the app: no ASGI middleware chain (~11 µs of a push) and no Starlette app call. uvicorn's request
  cycle stays (keep-alive, pipelining order, flow control, the answer's framing, its default headers).
  The same rules run, as the same functions the middleware calls, in the middleware's order: proxy
  headers (api/shared/forwarded.py), metrics (api/status/metrics.py), the 500 with a request id
  (api/shared/internal.py), Host, cross-site, token, level, tenant and Content-Type
  (queen_pg/security/middleware.py), the body limit (api/shared/limits.py), admission
  (api/shared/admission.py). A request that is not plain falls back to the app: a body without
  Content-Length (chunked), ``Expect: 100-continue``, an ``Upgrade``, HTTP/1.0, an ``Origin`` while
  CORS is configured (CORSMiddleware decides those), a hot path with another method (405).
- :class:`HotRoutes`, the innermost pure-ASGI middleware: what reaches the app (fallbacks, or every
  request with ``QUEEN_HOT_PROTOCOL=0``) is matched there, inside the middleware chain.

An exception from the endpoint goes to the app's own exception handlers (``app.exception_handlers``,
looked up by class as Starlette's ExceptionMiddleware does: QueenError, Verdict, ...); one no handler
takes becomes the 500 with a request id (``InternalErrors``' rule), as it would from the router.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from queen_pg.api.shared import admission, limits
from queen_pg.api.shared.forwarded import Forwarded, access_line
from queen_pg.api.shared.forwarded import log as access_log
from queen_pg.api.shared.internal import Tracked
from queen_pg.api.shared.internal import answer as internal_answer
from queen_pg.api.status.metrics import request_done
from queen_pg.metrics import Metrics
from queen_pg.security.middleware import Checks

Handler = Callable[[Request, Exception], Awaitable[Response]]


def hot_routes() -> list[APIRoute]:
    """The routes served here (the data plane's, docs/wire.md#push)."""
    from queen_pg.api import ack, pop, push, transaction

    routes = (*push.router.routes, *pop.router.routes, *ack.router.routes, *transaction.router.routes)
    return [r for r in routes if isinstance(r, APIRoute)]


class HotTable:
    """Which hot route, if any, a request is for."""

    def __init__(self, routes: Iterable[APIRoute]) -> None:
        self.by_method: dict[str, list[APIRoute]] = {}
        for route in routes:
            for method in route.methods or ():
                self.by_method.setdefault(method, []).append(route)

    def find(self, scope: Scope) -> tuple[APIRoute, Scope] | None:
        """The route and what its match puts into the scope (endpoint, path parameters, ``route``: the
        metrics label); None: not hot."""
        for route in self.by_method.get(scope["method"], ()):
            match, child = route.matches(scope)
            if match is Match.FULL:
                return route, child
        return None


async def serve(route: APIRoute, scope: Scope, receive: Receive, send: Send) -> None:
    """Await ``route``'s endpoint and send its answer (or the app's handler's for its exception)."""
    request = Request(scope, receive, send)
    endpoint: Callable[..., Awaitable[Response]] = route.endpoint
    try:
        response = await endpoint(request, **scope["path_params"])
    except Exception as exc:
        handler = _handler(scope["app"].exception_handlers, exc)
        if handler is None:
            raise
        response = await handler(request, exc)
    await response(scope, receive, send)


class HotRoutes:
    """Pure ASGI: a request for one of ``routes`` is answered by its endpoint directly."""

    def __init__(self, app: ASGIApp, routes: Iterable[APIRoute]) -> None:
        self.app = app
        self.table = HotTable(routes)
        self.served = 0  # requests answered here (tests read it)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self.table.find(scope) if scope["type"] == "http" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        self.served += 1
        route, child = found
        scope.update(child)
        await serve(route, scope, receive, send)


# a request carrying one of these is left to the app (see the module doc)
_FALLBACK = frozenset({b"transfer-encoding", b"upgrade"})


class HotPath:
    """The protocol's way in (the module doc): one per app, built by its lifespan."""

    def __init__(
        self, app: FastAPI, checks: Checks, metrics: Metrics, max_body: int, trusted_proxies: str, cors: bool
    ) -> None:
        self.app = app
        self.table = HotTable(hot_routes())
        self.checks = checks
        self.metrics = metrics
        self.max_body = max_body
        self.forwarded = Forwarded(None, trusted_proxies)
        self.fallback = _FALLBACK | {b"origin"} if cors else _FALLBACK
        self.served = 0  # requests answered here (tests read it)

    def app_for(self, scope: Scope) -> ASGIApp | None:
        """What answers this request from the protocol; None: the app does (``scope`` untouched)."""
        if scope["method"] not in self.table.by_method:
            return None
        fallback = self.fallback
        for name, _ in scope["headers"]:
            if name in fallback:
                return None
        found = self.table.find(scope)
        return None if found is None else functools.partial(self._run, *found)

    async def _run(self, route: APIRoute, child: Scope, scope: Scope, receive: Receive, send: Send) -> None:
        """The middleware chain's rules, in its order (queen_pg/app.py), then the endpoint."""
        self.served += 1
        scope["app"] = self.app
        started = time.perf_counter()
        tracked = Tracked(send)
        await self.forwarded.apply(scope)
        try:
            try:
                await self._admitted(route, child, scope, receive, tracked)
            except Exception as exc:
                await internal_answer(scope, tracked, exc)
        finally:
            request_done(self.metrics, scope, tracked.status, started)
            if access_log.isEnabledFor(logging.DEBUG):
                access_line(scope, tracked.status if tracked.started else 0, started)

    async def _admitted(self, route: APIRoute, child: Scope, scope: Scope, receive: Receive, send: Send) -> None:
        if not await self.checks.admit(scope, send) or not await limits.admit(scope, send, self.max_body):
            return
        go, permit = await admission.admit(scope, send)
        if not go:
            return
        scope.update(child)  # matched only now, as in the app: a refusal above is counted as <unmatched>
        if permit is None:
            await serve(route, scope, receive, send)
            return
        body = admission.metered(permit, receive) if permit.chunked else receive
        try:
            await serve(route, scope, body, permit.releasing(send))
        finally:
            permit.release()


def _handler(handlers: dict[Any, Handler], exc: Exception) -> Handler | None:
    for cls in type(exc).__mro__:
        if cls in handlers:
            return handlers[cls]
    return None
