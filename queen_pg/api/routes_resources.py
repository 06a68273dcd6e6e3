"""Resources (WIRE.md §2.12): overview, queues, one queue, its depth, partitions, namespaces, tasks; and
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

from queen_pg.api.common import check_name, json_response, q_int, state, tenant
from queen_pg.api.docs import answers, params, query
from queen_pg.api.schemas import page
from queen_pg.api.schemas_admin import (
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

router = APIRouter(prefix="/api/v1")

DEFAULT_PAGE = 100
MAX_PAGE = 1000
MAX_OFFSET = 2**31 - 1


def page_params(request: Request, default: int = DEFAULT_PAGE, most: int = MAX_PAGE) -> admin.Page:
    """``limit`` (1..most) and ``offset`` (>= 0) of a paged list; anything else is a 400."""
    limit = q_int(request, "limit", default, 1, most) or default
    offset = q_int(request, "offset", 0, 0, MAX_OFFSET) or 0
    return admin.Page(limit, offset)


def name_param(request: Request, name: str) -> str | None:
    """An optional name filter from the query string (empty = absent)."""
    value = request.query_params.get(name) or None
    return check_name(name, value) if value is not None else None


@router.get(
    "/resources/overview",
    summary="Counts over every queue: partitions, messages, backlog, DLQ, ...",
    responses=answers({200: Overview}),
)
async def overview(request: Request) -> Response:
    st = state(request)
    return json_response(await admin.overview(st.db, tenant(request)))


@router.get(
    "/resources/queues",
    summary="Queues with partitions, backlog, in flight, DLQ and per-group lag",
    openapi_extra=params(
        query("search", "case-insensitive substring of the queue name"),
        query("namespace", "only queues tagged with this namespace"),
        query("task", "only queues tagged with this task"),
        *page(),
    ),
    responses=answers({200: QueueList}, 400, 413),
)
async def list_queues(request: Request) -> Response:
    page = page_params(request)
    search = request.query_params.get("search") or None
    namespace = name_param(request, "namespace")
    task = name_param(request, "task")
    st = state(request)
    return json_response(await admin.list_queues(st.db, tenant(request), page, search, namespace, task))


@router.get(
    "/resources/queues/{queue}",
    summary="One queue: summary, config, groups, a page of partitions",
    description="`limit`/`offset` page the partitions (by name); `partitionsTotal` counts them all.",
    openapi_extra=params(*page()),
    responses=answers({200: QueueDetail}, 400, 404, 413),
)
async def get_queue(request: Request, queue: str) -> Response:
    check_name("queue", queue)
    page = page_params(request)
    st = state(request)
    return json_response(await admin.get_queue(st.db, tenant(request), queue, page))


@router.get(
    "/resources/queues/{queue}/depth",
    summary="Pending messages per partition (a group's, or the worst)",
    openapi_extra=params(
        query("group", "this consumer group's lag (`__QUEUE_MODE__`: queue mode); absent: each partition's backlog"),
        *page(default=MAX_PAGE, most=10 * MAX_PAGE),
    ),
    responses=answers({200: QueueDepth}, 400, 404, 413),
)
async def queue_depth(request: Request, queue: str) -> Response:
    check_name("queue", queue)
    group = name_param(request, "group")
    page = page_params(request, default=MAX_PAGE, most=10 * MAX_PAGE)
    st = state(request)
    return json_response(await admin.queue_depth(st.db, tenant(request), queue, group, page))


@router.get(
    "/resources/partitions",
    summary="Partitions (of one queue, or all) with backlog and in flight",
    openapi_extra=params(query("queue", "only this queue's partitions"), *page()),
    responses=answers({200: PartitionList}, 400, 404, 413),
)
async def list_partitions(request: Request) -> Response:
    queue = name_param(request, "queue")
    page = page_params(request)
    st = state(request)
    return json_response(await admin.list_partitions(st.db, tenant(request), queue, page))


@router.get(
    "/resources/namespaces",
    summary="Namespaces with their queues, messages and backlog",
    openapi_extra=params(*page()),
    responses=answers({200: NamespaceList}, 400),
)
async def namespaces(request: Request) -> Response:
    page = page_params(request)
    st = state(request)
    return json_response(await admin.list_tags(st.db, tenant(request), "namespace", page))


@router.get(
    "/resources/tasks",
    summary="Tasks with their queues, messages and backlog",
    openapi_extra=params(*page()),
    responses=answers({200: TaskList}, 400),
)
async def tasks(request: Request) -> Response:
    page = page_params(request)
    st = state(request)
    return json_response(await admin.list_tags(st.db, tenant(request), "task", page))


@router.get(
    "/consumer-groups/lagging",
    summary="Consumer groups whose oldest pending message is older than minLagSeconds (default 60)",
    openapi_extra=params(
        query("minLagSeconds", "age of the oldest pending message", type="integer", minimum=0, default=60),
        *page(),
    ),
    responses=answers({200: LaggingGroups}, 400),
)
async def lagging(request: Request) -> Response:
    min_lag = q_int(request, "minLagSeconds", 60, 0, 10 * 365 * 86400)
    page = page_params(request)
    st = state(request)
    return json_response(await admin.lagging_groups(st.db, tenant(request), min_lag or 0, page))
