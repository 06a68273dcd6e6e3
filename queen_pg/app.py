"""``create_app(settings)``: builds the FastAPI app; nothing happens at import.

The lifespan opens the pool (applying ``sql/`` first unless disabled) and closes it on the way out.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from queen_pg import __version__
from queen_pg.api import ack, dashboard, dlq, messages, pop, push, traces, transaction
from queen_pg.api.admin import groups as admin_groups
from queen_pg.api.admin import moves as admin_moves
from queen_pg.api.admin import routes as admin_routes
from queen_pg.api.hot import HotPath, HotRoutes, hot_routes
from queen_pg.api.kv import browse as kv_browse
from queen_pg.api.kv import locks as kv_locks
from queen_pg.api.kv import routes as kv_routes
from queen_pg.api.shared.admission import Admission, ByteBudget
from queen_pg.api.shared.common import AppState, json_response
from queen_pg.api.shared.docs import install as install_docs
from queen_pg.api.shared.forwarded import Forwarded
from queen_pg.api.shared.internal import InternalErrors
from queen_pg.api.shared.limits import BodyLimit
from queen_pg.api.status import resources as status_resources
from queen_pg.api.status import system as status_system
from queen_pg.api.status.metrics import HttpMetrics
from queen_pg.api.status.metrics import router as metrics_router
from queen_pg.api.timers import routes as timer_routes
from queen_pg.db.pool import Database
from queen_pg.engine import pop_render, sealing
from queen_pg.engine.fusion import FuseConfig, Fuser
from queen_pg.engine.waiters import Waiters
from queen_pg.errors import QueenError, Verdict
from queen_pg.jobs import start_jobs
from queen_pg.jobs.maintenance import start_refresher
from queen_pg.jobs.storage import StorageCheck
from queen_pg.jobs.supervisor import Supervisor
from queen_pg.limiter import LimiterConfig, build_limiters
from queen_pg.memtrim import run_trimmer
from queen_pg.mesh.node import from_settings as mesh_from_settings
from queen_pg.metrics import Metrics
from queen_pg.security import crypto
from queen_pg.security.access import declare_routes
from queen_pg.security.access import install as install_security
from queen_pg.security.roles import Level
from queen_pg.security.tenancy import enabled as tenancy_enabled
from queen_pg.security.web import split_list
from queen_pg.server import STATE_KEY, Transport, fit_connections, install_lame_duck, tune_gc
from queen_pg.settings import MIB, Settings

log = logging.getLogger("queen_pg.app")


def _limiter_config(settings: Settings) -> LimiterConfig:
    return LimiterConfig(
        initial=settings.limiter_initial,
        min_limit=settings.limiter_min,
        max_limit=settings.limiter_max,
        max_queue=settings.limiter_queue,
        max_wait_s=settings.admit_hold_ms / 1000,
    )


# FastAPI's native OpenTelemetry (newer releases) asks the global providers on every request (~20 µs of
# a lone push's CPU) though the broker exports none: off (/metrics is the broker's telemetry). Older
# FastAPI releases have no such argument.
_NO_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


# The routes FastAPI adds itself (/openapi.json) and the docs pages install_docs adds: levels of routes
# that have no ``@level`` of their own. Pages with no data (the assets are public: roles.PUBLIC_PREFIXES).
DOC_PAGES = {
    ("GET", "/openapi.json"): Level.READ_ONLY,
    ("GET", "/docs"): Level.READ_ONLY,
    ("GET", "/redoc"): Level.READ_ONLY,
    ("GET", "/docs/assets/{name}"): Level.READ_ONLY,
}


def create_app(settings: Settings) -> FastAPI:
    if not settings.database_url:
        raise ValueError("settings.database_url is required (the CLI sets it for the embedded database)")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        db = Database(settings.database_url or "", settings.db_pool_size)
        await db.open(apply_schema=settings.apply_schema)
        storage = StorageCheck(
            settings.disk_path, settings.disk_high_pct, settings.db_max_bytes, settings.storage_check_ms / 1000
        )
        app.state.queen = AppState(
            settings=settings,
            db=db,
            waiters=Waiters(
                settings.max_waiters,
                settings.pop_poll_interval_ms / 1000,
                settings.pop_poll_max_ms / 1000,
                tenant_share=settings.waiters_tenant_share if tenancy_enabled(settings) else 1.0,
            ),
            limiters=build_limiters(_limiter_config(settings)),
            admission=ByteBudget(
                settings.admit_max_mb * MIB,
                settings.max_body_bytes,
                settings.admit_hold_ms / 1000,
                tenant_share=settings.admit_tenant_share if tenancy_enabled(settings) else 1.0,
                max_decoded=settings.decoded_cap,
            ),
            storage=storage,
        )
        crypto.bind(
            db,
            crypto.Vault.from_settings(
                settings.encryption_key, settings.encryption_keys_old, settings.encryption_seal_version
            ),
        )
        pop_render.bind(db, pop_render.SegmentCache(settings.pop_cache_mb * 1024 * 1024))
        fuser = app.state.queen.fuser = Fuser(
            db,
            FuseConfig(
                settings.fuse_hold_us,
                settings.fuse_max_items,
                settings.fuse_inflight,
                settings.fuse_max_calls,
                pops=settings.fuse_pops,
            ),
            limiters=app.state.queen.limiters,  # one permit per procedure call, fused or not
        )
        jobs = app.state.jobs = Supervisor()
        if settings.jobs_enabled:
            start_jobs(
                jobs,
                db,
                app.state.queen.waiters.notify,
                settings.stats_retention_hours,
                settings.trace_retention_hours,
                settings.stats_snapshot_interval_s,
            )
        # in every process, jobs or not: it gates this process's pushes and pops
        refresher = await start_refresher(jobs, db, app.state.queen.maintenance, settings.maintenance_refresh_ms / 1000)
        mesh = app.state.queen.mesh = mesh_from_settings(settings, app.state.queen.waiters, refresher.kick)
        if mesh is not None:
            mesh.on_config = sealing.forgetting(crypto.vault(db), mesh.on_config)  # a peer configured a queue
            await mesh.start()  # binds now (a port in use fails the boot); dials under the supervisor
            jobs.start("mesh", mesh.run)
        if storage.enabled:  # in every process, jobs or not: it gates this process's pushes
            await storage.refresh(db)
            jobs.start_job(storage, db)
        if settings.malloc_trim_s > 0:  # in every process: its own heap
            jobs.start("malloc_trim", lambda: run_trimmer(settings.malloc_trim_s))
        if metrics.multiprocess_dir:  # several workers: keep this one's gauges current for any scrape
            q = app.state.queen
            jobs.start("metrics_sampler", lambda: metrics.run_sampler(db, q.waiters, q.limiters, jobs, q.mesh))
        transport = Transport(
            settings.header_timeout_s,
            fit_connections(settings.max_connections),
            app.state.queen.waiters.drain,
            drain_delay_s=settings.drain_delay_ms / 1000,
            body_idle_timeout_s=settings.body_idle_timeout_s,
            max_head_bytes=settings.max_head_bytes,
            token_required=settings.jwt_enabled,
        )
        if settings.hot_protocol:  # the data plane answered from the protocol, same rules (api/hot.py)
            cors = bool(split_list(settings.cors_origins))
            transport.hot = HotPath(app, checks, metrics, settings.max_body_bytes, settings.trusted_proxies, cors)
        app.state.queen.transport = transport
        install_lame_duck(transport)  # SIGTERM: /health 503 and a delay before the listener closes
        log.info("event=broker_ready version=%s pool=%d", __version__, settings.db_pool_size)
        try:
            yield {STATE_KEY: transport}  # the server's protocol reads it (queen_pg/server.py)
        finally:
            if transport.drain_started is None:  # no connection was open: nothing parked to drain
                transport.begin_drain(0)
            log.info(transport.shutdown_line())
            await fuser.close()  # fused calls whose requests went away
            await jobs.stop()  # before the pool closes: a job may be inside a call (and the mesh closes)
            app.state.queen.waiters.close()
            await db.close()
            metrics.close()
            log.info("event=broker_stopped")

    app = FastAPI(
        title="queen-pg",
        version=__version__,
        description="A message broker whose only durable state lives in PostgreSQL.",
        lifespan=lifespan,
        **_NO_TELEMETRY,
        docs_url=None,  # /docs and /redoc with their assets served here, not from a CDN: api/docs.py
        redoc_url=None,
    )
    app.add_middleware(HotRoutes, routes=hot_routes())  # innermost: the data routes without FastAPI's per-request work
    app.add_middleware(Admission)  # inside BodyLimit: an oversized body is 413 before it takes permits
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    checks = app.state.checks = install_security(
        app, settings
    )  # host, token, level, tenant, Content-Type: before any body is read
    app.add_middleware(InternalErrors)  # an exception no handler took: a 500 with a request id, no text
    metrics = app.state.metrics = Metrics()
    app.add_middleware(HttpMetrics, metrics=metrics)  # sees every answer, 413s included
    app.add_middleware(Forwarded, trusted=settings.trusted_proxies)  # client/scheme for logs: trusted proxies

    @app.exception_handler(QueenError)
    async def _queen_error(request: Request, exc: QueenError) -> Response:
        return json_response(exc.body(), exc.status, exc.headers())

    @app.exception_handler(Verdict)
    async def _verdict(request: Request, exc: Verdict) -> Response:
        # a refusal decided in SQL: nothing was written; clients read it from a 200 body (docs/wire.md#verdicts)
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

    app.include_router(push.router)
    app.include_router(pop.router)
    app.include_router(ack.router)
    app.include_router(admin_routes.router)
    app.include_router(status_resources.router)  # before admin_groups: /consumer-groups/lagging
    app.include_router(messages.router)
    app.include_router(traces.router)
    app.include_router(status_system.router)
    app.include_router(dlq.router)
    app.include_router(admin_moves.router)  # docs/wire.md#legacy-admin: POST …/{tid}/dlq, DELETE /queues/{q}/clear
    app.include_router(admin_groups.router)
    app.include_router(kv_routes.router)
    app.include_router(kv_locks.router)
    app.include_router(kv_browse.router)
    app.include_router(timer_routes.router)
    app.include_router(transaction.router)
    app.include_router(metrics_router)

    app.include_router(dashboard.router)  # / and /dashboard/<file>: the embedded UI (webapp/)
    install_docs(app)  # /openapi.json (the request bodies the routes parse themselves), /docs, /redoc
    declare_routes(app, checks, DOC_PAGES)  # every route's level (@level beside it) to the security middleware
    return app


def app_from_env() -> FastAPI:
    """The app of one ``queen-pg serve --workers N`` worker (uvicorn factory
    ``queen_pg.app:app_from_env``): settings from the environment the parent exported
    (queen_pg/cli_workers.py), the embedded database's DSN included."""
    settings = Settings()
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr
    )
    app = create_app(settings)
    tune_gc(settings)  # a serving worker process: its collector, as `serve` tunes it
    return app
