"""Resources (docs/wire.md#admin): overview, queues, one queue, its depth, partitions, namespaces, tasks; and
the consumer groups that lag (``/consumer-groups/lagging``, registered before ``/consumer-groups/{group}``
so that it is not read as a group name).

Lists are paged with ``limit`` (1-1000, default 100) and ``offset`` and answer ``total``. Terms:
``messages`` every offset ever given, ``backlog`` the largest group lag (with no group: the retained
messages), ``inFlight`` messages under a live lease not yet acked, ``dlq`` dead letters; see
``sql/procedures/100_resources.sql``. An unknown queue is a 404 ``not_found``.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request

from queen_pg.api.shared.common import check_name
from queen_pg.api.shared.params import MAX_OFFSET, MAX_PAGE, PAGE, Param, page, page_params
from queen_pg.api.shared.reads import db_tenant, read_route
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

router = APIRouter(prefix="/api/v1")

DEPTH_PAGE = page(MAX_PAGE, 10 * MAX_PAGE, MAX_OFFSET)
SEARCH = Param("search", "case-insensitive substring of the queue name", "text")
NAMESPACE = Param("namespace", "only queues tagged with this namespace")
TASK = Param("task", "only queues tagged with this task")
GROUP = Param("group", "this consumer group's lag (`__QUEUE_MODE__`: queue mode); absent: each partition's backlog")
QUEUE = Param("queue", "only this queue's partitions")
MIN_LAG = Param("minLagSeconds", "age of the oldest pending message", "int", 60, 0, 10 * 365 * 86400)


@read_route(
    router, "/resources/overview", Overview, summary="Counts over every queue: partitions, messages, backlog, DLQ, ..."
)
async def overview(request: Request) -> Any:
    return await admin.overview(*db_tenant(request))


@read_route(
    router,
    "/resources/queues",
    QueueList,
    summary="Queues with partitions, backlog, in flight, DLQ and per-group lag",
    query=(SEARCH, NAMESPACE, TASK, *PAGE),
    errors=(400, 413),
)
async def list_queues(request: Request) -> Any:
    search, namespace, task = SEARCH.read(request), NAMESPACE.read(request), TASK.read(request)
    return await admin.list_queues(*db_tenant(request), page_params(request), search, namespace, task)


@read_route(
    router,
    "/resources/queues/{queue}",
    QueueDetail,
    summary="One queue: summary, config, groups, a page of partitions",
    description="`limit`/`offset` page the partitions (by name); `partitionsTotal` counts them all.",
    query=PAGE,
    errors=(400, 404, 413),
)
async def get_queue(request: Request, queue: str) -> Any:
    check_name("queue", queue)
    return await admin.get_queue(*db_tenant(request), queue, page_params(request))


@read_route(
    router,
    "/resources/queues/{queue}/depth",
    QueueDepth,
    summary="Pending messages per partition (a group's, or the worst)",
    query=(GROUP, *DEPTH_PAGE),
    errors=(400, 404, 413),
)
async def queue_depth(request: Request, queue: str) -> Any:
    check_name("queue", queue)
    group = GROUP.read(request)
    return await admin.queue_depth(*db_tenant(request), queue, group, page_params(request, DEPTH_PAGE))


@read_route(
    router,
    "/resources/partitions",
    PartitionList,
    summary="Partitions (of one queue, or all) with backlog and in flight",
    query=(QUEUE, *PAGE),
    errors=(400, 404, 413),
)
async def list_partitions(request: Request) -> Any:
    queue = QUEUE.read(request)
    return await admin.list_partitions(*db_tenant(request), queue, page_params(request))


def _tags(kind: Literal["namespace", "task"], answer: Any, summary: str) -> None:
    """``/resources/namespaces`` and ``/resources/tasks``: the queues' tags of one kind, paged."""

    async def tags(request: Request) -> Any:
        return await admin.list_tags(*db_tenant(request), kind, page_params(request))

    tags.__name__ = f"{kind}s"
    read_route(router, f"/resources/{kind}s", answer, summary=summary, query=PAGE, errors=(400,))(tags)


_tags("namespace", NamespaceList, "Namespaces with their queues, messages and backlog")
_tags("task", TaskList, "Tasks with their queues, messages and backlog")


@read_route(
    router,
    "/consumer-groups/lagging",
    LaggingGroups,
    summary="Consumer groups whose oldest pending message is older than minLagSeconds (default 60)",
    query=(MIN_LAG, *PAGE),
    errors=(400,),
)
async def lagging(request: Request) -> Any:
    min_lag: int = MIN_LAG.read(request)
    return await admin.lagging_groups(*db_tenant(request), min_lag, page_params(request))
