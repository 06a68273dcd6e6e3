"""System routes: maintenance switches, status and analytics, process metrics, stats refresh.

Maintenance (Queen 0.x paths and names): ``GET/POST /api/v1/system/maintenance`` is the push switch
(``{"enabled": bool}``; answers ``maintenanceMode``), ``GET/POST /api/v1/system/maintenance/pop`` the
pop switch (answers ``popMaintenanceMode``); every answer carries both. The switches live in
PostgreSQL; every replica re-reads them at least once a second (``queen_pg/jobs/maintenance.py``) and
the replica that flips one applies it at once. :func:`refuse_push_in_maintenance` and
:func:`pop_in_maintenance` are the checks the data-plane routes make (no database call).
"""

from __future__ import annotations

import os
import resource
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg import __version__
from queen_pg.api.shared.body import read
from queen_pg.api.shared.common import check_name, json_response, state, tenant
from queen_pg.api.shared.docs import answers, body
from queen_pg.api.shared.params import PAGE, page_params
from queen_pg.api.shared.reads import db_tenant, read_route
from queen_pg.api.shared.schemas import window
from queen_pg.api.status.schemas import (
    Analytics,
    MaintenanceAnswer,
    StatsRefreshAnswer,
    StatusAnswer,
    StatusQueueDetail,
    StatusQueues,
    SystemMetrics,
    WorkerMetrics,
)
from queen_pg.engine import admin
from queen_pg.engine import maintenance as maintenance_engine
from queen_pg.errors import FORBIDDEN, QueenError
from queen_pg.mesh.node import Mesh
from queen_pg.security.access import level
from queen_pg.security.roles import Level
from queen_pg.security.tenancy import enabled as tenancy_enabled

router = APIRouter(prefix="/api/v1")

BUCKETS = {"minute": 60, "hour": 3600, "day": 86400}
MAX_BUCKETS = 10_080  # a week of minutes
DEFAULT_WINDOW = timedelta(hours=1)
FUTURE = timedelta(days=1)  # a window's end beyond now + FUTURE reads as now + FUTURE
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class SwitchBody(msgspec.Struct):
    enabled: bool


SWITCH_DESCRIPTION = (
    "Stored in PostgreSQL: this replica applies it at once, every other within a second. The answer carries "
    "both switches. System-wide: with tenancy on, only the default tenant may flip it (403 otherwise)."
)


async def _flip(request: Request, switch: maintenance_engine.Switch) -> Response:
    st = state(request)
    # the switches are system-wide (every tenant's pushes or pops): with tenancy on, only the operator's
    # tenant (QUEEN_DEFAULT_TENANT) may flip them, so one tenant's admin cannot pause another's traffic
    if tenancy_enabled(st.settings) and tenant(request) != st.settings.default_tenant:
        raise QueenError(
            FORBIDDEN,
            detail="the maintenance switches are system-wide: only an admin of the default tenant "
            f"({st.settings.default_tenant!r}) may flip them",
        )
    body = await read(request, SwitchBody)
    await maintenance_engine.set_switch(st.db, st.maintenance, switch, body.enabled)
    if st.mesh is not None:  # the other replicas re-read the switches now, not at their next tick
        st.mesh.publish_maintenance()
    return json_response({"success": True, **st.maintenance.answer()})


def _switch(switch: maintenance_engine.Switch, path: str, mode: str, effect: str, while_on: str) -> None:
    """GET and POST of one maintenance switch (``maintenanceMode`` is push maintenance)."""
    prefix = "" if switch == "push" else f"{switch}_"

    async def get(request: Request) -> Any:
        st = state(request)
        await maintenance_engine.refresh(st.db, st.maintenance)  # answer what is stored, not the cache
        return st.maintenance.answer()

    async def flip(request: Request) -> Response:
        return await _flip(request, switch)

    get.__name__, flip.__name__ = f"get_{prefix}maintenance", f"set_{prefix}maintenance"
    summary = f"The maintenance switches ({mode} = {switch} maintenance)"
    read_route(
        router, path, MaintenanceAnswer, summary=summary, description="Read from PostgreSQL, not this process's cache."
    )(get)
    router.post(
        path,
        summary=f'{switch.capitalize()} maintenance on/off: {{"enabled": bool}}; {effect}',
        description=f"{SWITCH_DESCRIPTION} While on, {while_on}.",
        openapi_extra=body(SwitchBody),
        responses=answers({200: MaintenanceAnswer}, 400, 403, 413),
    )(level(Level.ADMIN)(flip))


_switch(
    "push",
    "/system/maintenance",
    "maintenanceMode",
    "pushes get 503",
    "pushes (and transactions that push) get 503 `maintenance`",
)
_switch(
    "pop", "/system/maintenance/pop", "popMaintenanceMode", "pops answer 204", "pops answer 204 (no messages) at once"
)


@router.post(
    "/stats/refresh",
    summary="Recompute the caller's overview counts now (no body)",
    description="Takes no body (the client sends `Content-Length: 0`). `/status` and `/resources/overview` "
    "read counts the stats_snapshot job refreshes every few seconds (their `asOf`); this recomputes the "
    "caller's tenant's at once, at the cost of one pass over that tenant's queues.",
    responses=answers({200: StatsRefreshAnswer}),
)
@level(Level.ADMIN)
async def stats_refresh(request: Request) -> Response:
    st = state(request)
    return json_response(await admin.refresh_stats(st.db, tenant(request)))


WINDOW = window()
QUEUE_WINDOW = window(queue=True)


def window_params(request: Request) -> admin.Window:
    """``from``/``to`` (default: the hour before now) and ``interval``. A window at or before its start
    is empty; one wider than MAX_BUCKETS buckets is cut to the MAX_BUCKETS ending at ``to`` (the answer's
    ``from`` says where it starts)."""
    since_p, until_p, interval_p = WINDOW
    now = datetime.now(UTC)
    # no samples lie ahead or before 1970 (the buckets' origin): a window's ends are clamped to that span
    until = min(max(until_p.read(request) or now, EPOCH), now + FUTURE)
    since = max(since_p.read(request) or until - DEFAULT_WINDOW, EPOCH)
    bucket = BUCKETS[interval_p.read(request)]
    widest = timedelta(seconds=bucket * MAX_BUCKETS)
    if until - since > widest:
        since = until - widest
    return admin.Window(min(since, until), until, bucket)


@read_route(router, "/status", StatusAnswer, summary="Broker status: overview counts, maintenance, recent throughput")
async def status(request: Request) -> Any:
    body = await admin.status(*db_tenant(request))
    return {"status": "ok", "version": __version__, "database": "up", **body}


@read_route(
    router,
    "/status/queues",
    StatusQueues,
    summary="Per-queue status with throughput over from..to (default: last hour)",
    query=(*WINDOW, *PAGE),
    errors=(400,),
)
async def status_queues(request: Request) -> Any:
    window = window_params(request)
    return await admin.status_queues(*db_tenant(request), window, page_params(request))


@read_route(
    router,
    "/status/queues/{queue}",
    StatusQueueDetail,
    summary="One queue's status: groups, lag, throughput series",
    query=WINDOW,
    errors=(400, 404),
)
async def status_queue(request: Request, queue: str) -> Any:
    check_name("queue", queue)
    return await admin.status_queue(*db_tenant(request), queue, window_params(request))


@read_route(
    router,
    "/status/analytics",
    Analytics,
    summary="Time series per minute/hour/day: pushed, acked, backlog, lag (queue, from, to, interval)",
    description="Buckets come from the per-minute samples of the stats job, so they trail live counters by a "
    "few seconds; a bucket with no sample reads pushed 0, acked 0, backlog and lagSeconds null.",
    query=QUEUE_WINDOW,
    errors=(400, 404, 413),
)
async def analytics(request: Request) -> Any:
    queue = QUEUE_WINDOW[0].read(request)
    body = await admin.analytics(*db_tenant(request), queue, window_params(request))
    return {**body, "interval": WINDOW[2].read(request)}


def _process(request: Request) -> dict[str, Any]:
    st = state(request)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    pool = st.db.pool
    return {
        "pid": os.getpid(),
        "uptimeSeconds": round(time.time() - st.started_at, 3),
        "cpuSeconds": round(usage.ru_utime + usage.ru_stime, 3),
        "maxRssBytes": usage.ru_maxrss * 1024,
        "pool": {
            "size": pool.get_size(),
            "idle": st.db.idle_size(),
            "inUse": pool.get_size() - st.db.idle_size(),
            "max": pool.get_max_size(),
        },
        "longPoll": {"parked": st.waiters.parked, "limit": st.waiters.limit},
        # each route family's adaptive limiter (queen_pg/limiter.py): for the dashboard's overview
        "limiters": {
            name: {"limit": lim.limit, "inFlight": lim.in_flight, "queued": lim.queued}
            for name, lim in sorted(st.limiters.items())
        },
        "maintenance": {"push": st.maintenance.push, "pop": st.maintenance.pop},
        "jobs": list(request.app.state.jobs.names),
        "mesh": _mesh(st.mesh),
    }


def _mesh(mesh: Mesh | None) -> dict[str, Any] | None:
    """The replicas and workers this process reaches over the wake mesh (None: no mesh configured)."""
    if mesh is None:
        return None
    return {
        "node": mesh.node,
        "peers": [
            {"name": name, "worker": p.local, "connected": p.connected, "outbox": p.outbox.qsize()}
            for name, p in sorted(mesh.peers.items())
            if not p.is_self and p.twin is None  # this process, or a replica another address reaches
        ],
        "framesSent": mesh.frames_sent,
        "framesReceived": mesh.frames_received,
        "dropped": sum(mesh.dropped.values()),
    }


PROCESS_NOTE = (
    "this broker process only, at this instant (no database call, no history): pid, uptime, CPU, peak "
    "RSS, connection pool, parked long-poll pops, maintenance switches, background tasks, the mesh peers "
    "it reaches (other replicas and workers); time series "
    "come from /metrics (Prometheus) and /api/v1/status/analytics"
)


@read_route(
    router,
    "/analytics/system-metrics",
    SystemMetrics,
    summary="This process: CPU, memory, pool, long-poll waiters",
    description=PROCESS_NOTE,
)
async def system_metrics(request: Request) -> Any:
    now = datetime.now(UTC).isoformat()
    return {"timestamp": now, "version": __version__, **_process(request), "note": PROCESS_NOTE}


@read_route(
    router,
    "/analytics/worker-metrics",
    WorkerMetrics,
    summary="The worker answering (this process), as a one-entry list",
    description=PROCESS_NOTE,
)
async def worker_metrics(request: Request) -> Any:
    return {"timestamp": datetime.now(UTC).isoformat(), "workers": [_process(request)], "note": PROCESS_NOTE}
