"""``create_app(settings)``: builds the FastAPI app; nothing happens at import.

The lifespan opens the pool (applying ``sql/`` first unless disabled) and closes it on the way out.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from queen_pg import __version__
from queen_pg.api import (
    routes_admin,
    routes_data,
    routes_dlq,
    routes_groups,
    routes_kv,
    routes_timers,
    routes_tx,
)
from queen_pg.api.common import AppState, json_response
from queen_pg.api.limits import BodyLimit
from queen_pg.db.pool import Database
from queen_pg.engine.waiters import Waiters
from queen_pg.errors import QueenError, Verdict
from queen_pg.jobs import start_jobs
from queen_pg.jobs.supervisor import Supervisor
from queen_pg.settings import Settings

log = logging.getLogger("queen_pg.app")

WEBAPP = Path(__file__).resolve().parent.parent / "webapp"


def create_app(settings: Settings) -> FastAPI:
    if not settings.database_url:
        raise ValueError("settings.database_url is required (the CLI sets it for the embedded database)")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db = Database(settings.database_url or "", settings.db_pool_size)
        await db.open(apply_schema=settings.apply_schema)
        app.state.queen = AppState(settings=settings, db=db, waiters=Waiters(settings.max_waiters))
        jobs = app.state.jobs = Supervisor()
        if settings.jobs_enabled:
            start_jobs(jobs, db, app.state.queen.waiters.notify)
        log.info("event=broker_ready version=%s pool=%d", __version__, settings.db_pool_size)
        try:
            yield
        finally:
            await jobs.stop()  # before the pool closes: a job may be inside a call
            await db.close()
            log.info("event=broker_stopped")

    app = FastAPI(
        title="queen-pg",
        version=__version__,
        description="A message broker whose only durable state lives in PostgreSQL.",
        lifespan=lifespan,
    )
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)

    @app.exception_handler(QueenError)
    async def _queen_error(request: Request, exc: QueenError) -> Response:
        headers = {"Retry-After": "1"} if exc.status == 503 else None
        return json_response(exc.body(), exc.status, headers)

    @app.exception_handler(Verdict)
    async def _verdict(request: Request, exc: Verdict) -> Response:
        # a refusal decided in SQL: nothing was written; clients read it from a 200 body (WIRE.md §0.5)
        body = {"success": False, "reason": exc.reason, **exc.detail}
        body.setdefault("error", f"rolled back: {exc.reason}")
        return json_response(body)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return json_response({"error": f"{where}: {first.get('msg', 'invalid')}", "code": "bad_request"}, 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return json_response({"error": str(exc.detail), "code": code}, exc.status_code)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        log.exception("event=unhandled_error path=%s", request.url.path)
        return json_response({"error": f"internal error: {exc.__class__.__name__}", "code": "internal"}, 500)

    app.include_router(routes_data.router)
    app.include_router(routes_admin.router)
    app.include_router(routes_dlq.router)
    app.include_router(routes_groups.router)
    app.include_router(routes_kv.router)
    app.include_router(routes_timers.router)
    app.include_router(routes_tx.router)

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return FileResponse(WEBAPP / "index.html", media_type="text/html")

    return app
