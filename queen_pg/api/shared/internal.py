"""The last line of defence, as a pure ASGI middleware: an exception no handler took becomes a 500
``{"error": ..., "code": "internal", "requestId": ...}`` whose body carries no exception text, and one
log line ``event=internal_error request_id=... path=...`` with the cause and its traceback.

It sits inside the metrics middleware (so the 500 is counted) and outside everything else. The
exception is not re-raised: Starlette's outer error middleware would log it a second time, without
the request id. When the answer had already started, the connection is closed instead (re-raising
lets the server do that), after the one log line.
"""

from __future__ import annotations

import logging

import orjson
from starlette.requests import ClientDisconnect
from starlette.types import Message, Receive, Scope, Send

from queen_pg.api.shared.middleware import HttpMiddleware
from queen_pg.errors import internal, log_value

log = logging.getLogger("queen_pg.app")


class InternalErrors(HttpMiddleware):
    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        tracked = Tracked(send)
        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            await answer(scope, tracked, exc)


class Tracked:
    """``send`` that remembers whether the answer has started, and its status (500 until it starts:
    an exception escaped every handler)."""

    __slots__ = ("send", "started", "status")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False
        self.status = 500

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            self.status = message["status"]
        await self.send(message)


async def answer(scope: Scope, send: Tracked, exc: Exception) -> None:
    """What an exception no handler took becomes (the module doc); shared by :class:`InternalErrors` and
    the protocol-level data plane (queen_pg/api/hot.py). Re-raises ``exc`` when the answer had started."""
    if isinstance(exc, ClientDisconnect):  # the client went away mid-body: nobody to answer, nothing broken
        log.debug("event=client_disconnect path=%s", log_value(scope.get("path", "?")))
        return
    err = internal(log, exc, path=scope.get("path", "?"))
    if send.started:
        raise exc
    body = orjson.dumps(err.body())
    await send(
        {
            "type": "http.response.start",
            "status": err.status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
