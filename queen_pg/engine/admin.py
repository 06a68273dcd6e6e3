"""Resources, status, analytics and lagging groups: one read-only procedure call each.

The procedures (``sql/procedures/100_resources.sql``, ``140_status.sql``) build the JSON answer; an
unknown queue or group comes back as ``{"notFound": kind}`` (or NULL) and is raised here as a 404
``not_found`` QueenError. Queue mode is the group ``__QUEUE_MODE__``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import orjson

from queen_pg.db.pool import Database
from queen_pg.engine.pop import QUEUE_MODE, group_label
from queen_pg.errors import NOT_FOUND, QueenError

OVERVIEW_SQL = "SELECT queen.resources_overview_v1($1)"
QUEUES_SQL = "SELECT queen.resources_queues_v1($1, $2, $3, $4, $5, $6)"
QUEUE_SQL = "SELECT queen.resources_queue_v1($1, $2, $3, $4)"
DEPTH_SQL = "SELECT queen.resources_queue_depth_v1($1, $2, $3, $4, $5)"
PARTITIONS_SQL = "SELECT queen.resources_partitions_v1($1, $2, $3, $4)"
TAGS_SQL = "SELECT queen.resources_tags_v1($1, $2, $3, $4)"
STATUS_SQL = "SELECT queen.status_v1($1)"
SNAPSHOT_SQL = "SELECT queen.stats_snapshot_v1(1, 0, NULL, $1)"
SNAPSHOT_AS_OF_SQL = "SELECT queen._iso_utc(s.as_of) FROM queen.tenant_stats s WHERE s.tenant = $1"
STATUS_QUEUES_SQL = "SELECT queen.status_queues_v1($1, $2, $3, $4, $5)"
STATUS_QUEUE_SQL = "SELECT queen.status_queue_v1($1, $2, $3, $4, $5)"
ANALYTICS_SQL = "SELECT queen.analytics_v1($1, $2, $3, $4, $5)"
LAGGING_SQL = "SELECT queen.consumer_groups_lagging_v1($1, $2, $3, $4)"


@dataclass(frozen=True, slots=True)
class Page:
    limit: int
    offset: int


@dataclass(frozen=True, slots=True)
class Window:
    """A time range [since, until) cut into buckets of ``bucket_seconds``."""

    since: datetime
    until: datetime
    bucket_seconds: int = 60


def _not_found(kind: str, queue: str | None, group: str | None = None) -> QueenError:
    if kind == "group":
        return QueenError(NOT_FOUND, detail=f"{group_label(group)} does not exist on queue {queue!r}")
    return QueenError(NOT_FOUND, detail=f"queue {queue!r} not found")


def _result(raw: Any, queue: str | None = None, group: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] | None = orjson.loads(raw) if raw is not None else None
    if result is None:
        raise _not_found("queue", queue)
    if "notFound" in result:
        raise _not_found(str(result["notFound"]), queue, group)
    return result


async def overview(db: Database, tenant: str) -> dict[str, Any]:
    return _result(await db.fetchval(OVERVIEW_SQL, tenant))


async def list_queues(
    db: Database, tenant: str, page: Page, search: str | None, namespace: str | None, task: str | None
) -> dict[str, Any]:
    raw = await db.fetchval(QUEUES_SQL, tenant, search, namespace, task, page.limit, page.offset)
    return _result(raw)


async def get_queue(db: Database, tenant: str, queue: str, partitions: Page) -> dict[str, Any]:
    """The queue's summary, config, groups and one page of partitions; 404 when it does not exist."""
    return _result(await db.fetchval(QUEUE_SQL, tenant, queue, partitions.limit, partitions.offset), queue)


async def queue_depth(db: Database, tenant: str, queue: str, group: str | None, page: Page) -> dict[str, Any]:
    raw = await db.fetchval(DEPTH_SQL, tenant, queue, group, page.limit, page.offset)
    result = _result(raw, queue, group)
    if result.get("group") == QUEUE_MODE:
        result["group"] = None
        result["queueMode"] = True
    return result


async def list_partitions(db: Database, tenant: str, queue: str | None, page: Page) -> dict[str, Any]:
    return _result(await db.fetchval(PARTITIONS_SQL, tenant, queue, page.limit, page.offset), queue)


async def list_tags(db: Database, tenant: str, kind: Literal["namespace", "task"], page: Page) -> dict[str, Any]:
    return _result(await db.fetchval(TAGS_SQL, tenant, kind, page.limit, page.offset))


async def refresh_stats(db: Database, tenant: str) -> dict[str, Any]:
    """Recompute the tenant's overview counts now (waits for a snapshot tick in progress)."""
    refreshed = await db.fetchval(SNAPSHOT_SQL, tenant)
    as_of = await db.fetchval(SNAPSHOT_AS_OF_SQL, tenant)
    return {"success": True, "refreshed": bool(refreshed), "asOf": as_of}


async def status(db: Database, tenant: str) -> dict[str, Any]:
    return _result(await db.fetchval(STATUS_SQL, tenant))


async def status_queues(db: Database, tenant: str, window: Window, page: Page) -> dict[str, Any]:
    raw = await db.fetchval(STATUS_QUEUES_SQL, tenant, window.since, window.until, page.limit, page.offset)
    return _result(raw)


async def status_queue(db: Database, tenant: str, queue: str, window: Window) -> dict[str, Any]:
    raw = await db.fetchval(STATUS_QUEUE_SQL, tenant, queue, window.since, window.until, window.bucket_seconds)
    return _result(raw, queue)


async def analytics(db: Database, tenant: str, queue: str | None, window: Window) -> dict[str, Any]:
    raw = await db.fetchval(ANALYTICS_SQL, tenant, queue, window.since, window.until, window.bucket_seconds)
    return _result(raw, queue)


async def lagging_groups(db: Database, tenant: str, min_lag_seconds: int, page: Page) -> dict[str, Any]:
    return _result(await db.fetchval(LAGGING_SQL, tenant, min_lag_seconds, page.limit, page.offset))
