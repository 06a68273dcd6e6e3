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
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from queen_pg.errors import internal, log_value

log = logging.getLogger("queen_pg.app")


class InternalErrors:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except ClientDisconnect:  # the client went away mid-body: nobody to answer, nothing broken
            log.debug("event=client_disconnect path=%s", log_value(scope.get("path", "?")))
        except Exception as exc:
            err = internal(log, exc, path=scope.get("path", "?"))
            if started:
                raise
            body = orjson.dumps(err.body())
            await send(
                {
                    "type": "http.response.start",
                    "status": err.status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
                }
            )
            await send({"type": "http.response.body", "body": body})
