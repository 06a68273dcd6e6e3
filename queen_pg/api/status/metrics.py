"""``GET /metrics`` (Prometheus text format 0.0.4), ``GET /metrics/queues`` (the per-queue series, one
page of queues per call), the HTTP metrics middleware, and the one-line helpers the data routes call
to count messages (``count_push``, ``count_pop``, ``count_ack``).

``/metrics`` stays small at any number of queues: message counters and database gauges are per tenant
(RabbitMQ's ``/metrics`` vs ``/metrics/per-object``). ``/metrics/queues?limit=&offset=`` answers the
same gauge names with ``queue`` (and ``consumer_group``) labels for queues ``offset`` .. ``offset+limit``
by (tenant, name), read live from the database (cost: that page's queues), plus
``queen_metrics_queues_total``; with tenancy on, the caller's tenant's queues only.

The middleware labels a request with its route *template* (``/api/v1/pop/queue/{queue}``), read
from ``scope["route"]`` after routing, never with the raw path: the label set stays bounded however
many queues exist. A request no route matched is labelled ``<unmatched>``.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from queen_pg.api.shared.common import state, tenant
from queen_pg.api.shared.docs import answers, params
from queen_pg.api.shared.internal import Tracked
from queen_pg.api.shared.middleware import HttpMiddleware
from queen_pg.api.shared.params import page, read_page
from queen_pg.engine import metrics as metrics_engine
from queen_pg.metrics import CONTENT_TYPE, UNMATCHED, Metrics, render_queues
from queen_pg.security import tenancy
from queen_pg.security.access import level
from queen_pg.security.roles import Level

router = APIRouter()


class HttpMetrics(HttpMiddleware):
    """Request count and latency per (method, route template, status)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        super().__init__(app)
        self.metrics = metrics

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        tracked = Tracked(send)
        try:
            await self.app(scope, receive, tracked)
        finally:
            request_done(self.metrics, scope, tracked.status, started)


def request_done(metrics: Metrics, scope: Scope, status: int, started: float) -> None:
    """Count one answered request under its route template (shared with queen_pg/api/hot.py)."""
    template = getattr(scope.get("route"), "path", None) or UNMATCHED
    metrics.request_done(scope["method"], template, status, time.perf_counter() - started)


@router.get(
    "/metrics",
    summary="Prometheus metrics (text format 0.0.4)",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text exposition"}},
)
@level(Level.READ_ONLY)
async def metrics(request: Request) -> Response:
    m: Metrics = request.app.state.metrics
    st = getattr(request.app.state, "queen", None)
    db = getattr(st, "db", None)
    m.sample(
        db,
        getattr(st, "waiters", None),
        getattr(st, "limiters", None),
        getattr(request.app.state, "jobs", None),
        getattr(st, "mesh", None),
    )
    if db is not None:
        await m.refresh(db)
    text = m.render()
    if st is not None and tenancy.enabled(st.settings):  # a tenant sees only its own labels
        text = tenancy.only_tenant(text, tenant(request))
    return Response(text, media_type=CONTENT_TYPE)


QUEUES_PAGE = page(1000, 10_000)


@router.get(
    "/metrics/queues",
    summary="Per-queue and per-group Prometheus series, one page of queues (by tenant, name)",
    description="The gauges of `/metrics` with `queue` and `consumer_group` labels (partitions, messages "
    "written, backlog, DLQ depth; group lag, lag seconds, leased partitions, DLQ depth) for `limit` queues "
    "from `offset`, read live; `queen_metrics_queues_total` counts every queue. Scrape it less often than "
    "`/metrics` (its cost grows with `limit`).",
    response_class=Response,
    openapi_extra=params(*QUEUES_PAGE),
    responses={
        **answers({}, 400),
        200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text exposition"},
    },
)
@level(Level.READ_ONLY)
async def metrics_queues(request: Request) -> Response:
    limit, offset = read_page(request, QUEUES_PAGE)
    st = state(request)
    who = tenant(request) if tenancy.enabled(st.settings) else None
    snap, total = await metrics_engine.queues_page(st.db, who, limit, offset)
    return Response(render_queues(snap, total), media_type=CONTENT_TYPE)
