"""The data plane's routes served straight from ASGI, inside the same FastAPI app and OpenAPI document.

FastAPI spends ~55 µs of CPU per request on a trivial route before the endpoint runs (its route-table
version walk, exception and exit-stack middleware, dependency solving: measured in-process, against
~14 µs for Starlette's router and ~5 µs for a bare ASGI call); for a 1-item push that is a sixth of
the broker's work. The hot routes (push, pop, ack, ack/batch, lease extend, transaction) take only
the ``Request`` and their path parameters, so :class:`HotRoutes`, the innermost pure-ASGI
middleware, matches them itself (the routes' own ``matches``: same path templates, same convertors,
same ``scope["route"]`` for the metrics label) and awaits the endpoint. Every other request, and a
hot path with another method (405), goes on to FastAPI's router as before; every route stays
registered and documented in FastAPI. The security middleware (queen_pg/security/middleware.py: Host,
cross-site, token, level, tenant, Content-Type) is outside this one, so the hot routes pass the same
checks as every other route before they are matched here.

An exception from the endpoint goes to the app's own exception handlers (``app.exception_handlers``,
looked up by class as Starlette's ExceptionMiddleware does: QueenError, Verdict, ...); one no handler
takes propagates to ``InternalErrors`` (a 500 with a request id), as it would from the router.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

Handler = Callable[[Request, Exception], Awaitable[Response]]


def hot_routes() -> list[APIRoute]:
    """The routes served by :class:`HotRoutes` (the data plane's, docs/wire.md#push)."""
    from queen_pg.api import ack, pop, push, transaction

    routes = (*push.router.routes, *pop.router.routes, *ack.router.routes, *transaction.router.routes)
    return [r for r in routes if isinstance(r, APIRoute)]


class HotRoutes:
    """Pure ASGI: a request for one of ``routes`` is answered by its endpoint directly."""

    def __init__(self, app: ASGIApp, routes: Iterable[APIRoute]) -> None:
        self.app = app
        self.by_method: dict[str, list[APIRoute]] = {}
        for route in routes:
            for method in route.methods or ():
                self.by_method.setdefault(method, []).append(route)
        self.served = 0  # requests answered here (tests read it)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for route in self.by_method.get(scope["method"], ()):
                match, child = route.matches(scope)
                if match is Match.FULL:
                    scope.update(child)
                    self.served += 1
                    await self._serve(route, scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _serve(self, route: APIRoute, scope: Scope, receive: Receive, send: Send) -> None:
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


def _handler(handlers: dict[Any, Handler], exc: Exception) -> Handler | None:
    for cls in type(exc).__mro__:
        if cls in handlers:
            return handlers[cls]
    return None
