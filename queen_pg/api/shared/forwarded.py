"""X-Forwarded-For / X-Forwarded-Proto from trusted proxies only, and the debug access log.

The broker usually sits behind a reverse proxy (``deploy/``). The address and scheme a request came
with are used for logs and metrics only, never to authorise anything. They are taken from
``X-Forwarded-For``/``X-Forwarded-Proto`` only when the connection comes from an address in
``trusted_proxies`` (addresses or CIDRs, ``*`` for any; uvicorn's own proxy-header handling is turned
off by ``queen-pg serve`` so this is the one place that decides); from anyone else the headers are
ignored and the peer address stands. With ``log_level=debug`` every request is logged as
``event=request client=... scheme=...``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from queen_pg.api.shared.middleware import HttpMiddleware
from queen_pg.errors import log_value

log = logging.getLogger("queen_pg.access")


class Forwarded(HttpMiddleware):
    def __init__(self, app: Any, trusted: str = "") -> None:
        super().__init__(app)
        hosts = [h.strip() for h in trusted.split(",") if h.strip()]
        # uvicorn's rules, applied to the scope in place (its app is a no-op: ours is called after)
        self.proxy: Any = ProxyHeadersMiddleware(_nothing, trusted_hosts=hosts) if hosts else None

    async def http(self, scope: Any, receive: Any, send: Any) -> None:
        await self.apply(scope)
        if not log.isEnabledFor(logging.DEBUG):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0

        async def sending(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            access_line(scope, status, started)

    async def apply(self, scope: Any) -> None:
        """The client address and scheme from a trusted proxy's headers, into ``scope`` (shared with the
        protocol-level data plane, queen_pg/api/hot.py)."""
        if self.proxy is not None:
            await self.proxy(scope, None, None)


async def _nothing(scope: Any, receive: Any, send: Any) -> None:
    return None


def access_line(scope: Any, status: int, started: float) -> None:
    """The debug access log line of one request."""
    client = scope.get("client") or ("-", 0)
    log.debug(
        "event=request client=%s scheme=%s method=%s path=%s status=%d ms=%.1f",
        client[0],
        scope.get("scheme", "http"),
        scope.get("method", "-"),
        log_value(scope.get("path", "-")),
        status,
        (time.perf_counter() - started) * 1000,
    )
