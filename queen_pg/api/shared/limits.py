"""Body-size limit as a pure ASGI middleware: refuse before the body is read."""

from __future__ import annotations

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from queen_pg.api.shared.middleware import HttpMiddleware
from queen_pg.errors import BODY_TOO_LARGE, QueenError


class BodyLimit(HttpMiddleware):
    """413 ``body_too_large`` when Content-Length (or the bytes streamed so far) exceed ``limit``."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        super().__init__(app)
        self.limit = limit

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not await admit(scope, send, self.limit):
            return
        seen = 0
        limit = self.limit

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise QueenError(BODY_TOO_LARGE, limit=limit)
            return message

        await self.app(scope, counted, send)


async def admit(scope: Scope, send: Send, limit: int) -> bool:
    """False, with the 413 sent, when the declared Content-Length exceeds ``limit`` (or is not a number);
    shared with the protocol-level data plane (queen_pg/api/hot.py), whose bodies all declare one."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                declared = -1
            if declared > limit or declared < 0:
                await _refuse(send, limit)
                return False
    return True


async def _refuse(send: Send, limit: int) -> None:
    err = QueenError(BODY_TOO_LARGE, limit=limit)
    body = orjson.dumps(err.body())
    await send(
        {
            "type": "http.response.start",
            "status": err.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
