"""Resources (docs/wire.md#admin): overview, queues, one queue, its depth, partitions, namespaces, tasks; and
the consumer groups that lag (``/consumer-groups/lagging``, registered before ``/consumer-groups/{group}``
so that it is not read as a group name).

Lists are paged with ``limit`` (1-1000, default 100) and ``offset`` and answer ``total``. Terms:
``messages`` every offset ever given, ``backlog`` the largest group lag (with no group: the retained
messages), ``inFlight`` messages under a live lease not yet acked, ``dlq`` dead letters; see
``sql/procedures/100_resources.sql``. An unknown queue is a 404 ``not_found``.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg.api.shared.common import check_name, json_response, state, tenant
from queen_pg.api.shared.docs import answers, params
from queen_pg.api.shared.params import MAX_OFFSET, MAX_PAGE, PAGE, Param, page, page_params
from queen_pg.api.status.schemas import (
    LaggingGroups,
    NamespaceList,
    Overview,
    PartitionList,
    QueueDepth,
    QueueDetail,
    QueueList,
    TaskList,
)
from queen_pg.engine import admin
from queen_pg.security.access import level
from queen_pg.security.roles import Level

router = APIRouter(prefix="/api/v1")

DEPTH_PAGE = page(MAX_PAGE, 10 * MAX_PAGE, MAX_OFFSET)
SEARCH = Param("search", "case-insensitive substring of the queue name", "text")
NAMESPACE = Param("namespace", "only queues tagged with this namespace")
TASK = Param("task", "only queues tagged with this task")
GROUP = Param("group", "this consumer group's lag (`__QUEUE_MODE__`: queue mode); absent: each partition's backlog")
QUEUE = Param("queue", "only this queue's partitions")
MIN_LAG = Param("minLagSeconds", "age of the oldest pending message", "int", 60, 0, 10 * 365 * 86400)


@router.get(
    "/resources/overview",
    summary="Counts over every queue: partitions, messages, backlog, DLQ, ...",
    responses=answers({200: Overview}),
)
@level(Level.READ_ONLY)
async def overview(request: Request) -> Response:
    st = state(request)
    return json_response(await admin.overview(st.db, tenant(request)))


@router.get(
    "/resources/queues",
    summary="Queues with partitions, backlog, in flight, DLQ and per-group lag",
    openapi_extra=params(SEARCH, NAMESPACE, TASK, *PAGE),
    responses=answers({200: QueueList}, 400, 413),
)
@level(Level.READ_ONLY)
async def list_queues(request: Request) -> Response:
    page = page_params(request)
    search = SEARCH.read(request)
    namespace = NAMESPACE.read(request)
    task = TASK.read(request)
    st = state(request)
    return json_response(await admin.list_queues(st.db, tenant(request), page, search, namespace, task))


@router.get(
    "/resources/queues/{queue}",
    summary="One queue: summary, config, groups, a page of partitions",
    description="`limit`/`offset` page the partitions (by name); `partitionsTotal` counts them all.",
    openapi_extra=params(*PAGE),
    responses=answers({200: QueueDetail}, 400, 404, 413),
)
@level(Level.READ_ONLY)
async def get_queue(request: Request, queue: str) -> Response:
    check_name("queue", queue)
    page = page_params(request)
    st = state(request)
    return json_response(await admin.get_queue(st.db, tenant(request), queue, page))


@router.get(
    "/resources/queues/{queue}/depth",
    summary="Pending messages per partition (a group's, or the worst)",
    openapi_extra=params(GROUP, *DEPTH_PAGE),
    responses=answers({200: QueueDepth}, 400, 404, 413),
)
@level(Level.READ_ONLY)
async def queue_depth(request: Request, queue: str) -> Response:
    check_name("queue", queue)
    group = GROUP.read(request)
    page = page_params(request, DEPTH_PAGE)
    st = state(request)
    return json_response(await admin.queue_depth(st.db, tenant(request), queue, group, page))


@router.get(
    "/resources/partitions",
    summary="Partitions (of one queue, or all) with backlog and in flight",
    openapi_extra=params(QUEUE, *PAGE),
    responses=answers({200: PartitionList}, 400, 404, 413),
)
@level(Level.READ_ONLY)
async def list_partitions(request: Request) -> Response:
    queue = QUEUE.read(request)
    page = page_params(request)
    st = state(request)
    return json_response(await admin.list_partitions(st.db, tenant(request), queue, page))


@router.get(
    "/resources/namespaces",
    summary="Namespaces with their queues, messages and backlog",
    openapi_extra=params(*PAGE),
    responses=answers({200: NamespaceList}, 400),
)
@level(Level.READ_ONLY)
async def namespaces(request: Request) -> Response:
    page = page_params(request)
    st = state(request)
    return json_response(await admin.list_tags(st.db, tenant(request), "namespace", page))


@router.get(
    "/resources/tasks",
    summary="Tasks with their queues, messages and backlog",
    openapi_extra=params(*PAGE),
    responses=answers({200: TaskList}, 400),
)
@level(Level.READ_ONLY)
async def tasks(request: Request) -> Response:
    page = page_params(request)
    st = state(request)
    return json_response(await admin.list_tags(st.db, tenant(request), "task", page))


@router.get(
    "/consumer-groups/lagging",
    summary="Consumer groups whose oldest pending message is older than minLagSeconds (default 60)",
    openapi_extra=params(MIN_LAG, *PAGE),
    responses=answers({200: LaggingGroups}, 400),
)
@level(Level.READ_ONLY)
async def lagging(request: Request) -> Response:
    min_lag: int = MIN_LAG.read(request)
    page = page_params(request)
    st = state(request)
    return json_response(await admin.lagging_groups(st.db, tenant(request), min_lag, page))
