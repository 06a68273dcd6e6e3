"""A bare FastAPI app for the ``floor`` scenario: what one request costs on this machine before queen-pg
does any work of its own. Same stack as the broker (uvicorn with uvloop/httptools, FastAPI, orjson,
asyncpg); ``POST /api/v1/push`` parses the JSON body and answers 201, with ``db`` after one
``SELECT 1`` on an asyncpg pool.

    python -m benchmarks.floor_app PORT plain|db [DSN]
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

ANSWER = b'[{"status":"queued"}]'


def create_app(dsn: str | None) -> FastAPI:
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if dsn:
            state["pool"] = await asyncpg.create_pool(dsn, min_size=2, max_size=20)
        yield
        if dsn:
            await state["pool"].close()

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> Response:
        return Response(b"{}", media_type="application/json")

    @app.post("/api/v1/push")
    async def push(request: Request) -> Response:
        orjson.loads(await request.body())
        if dsn:
            await state["pool"].fetchval("SELECT 1")
        return Response(ANSWER, status_code=201, media_type="application/json")

    return app


def main(argv: list[str]) -> int:
    port, mode = int(argv[1]), argv[2]
    dsn = argv[3] if mode == "db" else None
    uvicorn.run(create_app(dsn), host="127.0.0.1", port=port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
