"""The shape of our pure ASGI middlewares: HTTP requests go to :meth:`HttpMiddleware.http`, every other
scope (lifespan, websocket) straight to the app. Pure ASGI, not Starlette's ``BaseHTTPMiddleware``: no
task per request, and a body can be refused before it is read."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class HttpMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.http(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One HTTP request; ``self.app`` is the rest of the stack."""
        raise NotImplementedError
