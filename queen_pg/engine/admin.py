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
from queen_pg.engine import calls
from queen_pg.engine.pop import QUEUE_MODE, not_found


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


def _result(raw: Any, queue: str | None = None, group: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] | None = orjson.loads(raw) if raw is not None else None
    if result is None:
        raise not_found("queue", queue)
    if "notFound" in result:
        raise not_found(str(result["notFound"]), queue, group=group)
    return result


async def overview(db: Database, tenant: str) -> dict[str, Any]:
    return _result(await db.fetchval(calls.RESOURCES_OVERVIEW, tenant))


async def list_queues(
    db: Database, tenant: str, page: Page, search: str | None, namespace: str | None, task: str | None
) -> dict[str, Any]:
    raw = await db.fetchval(calls.RESOURCES_QUEUES, tenant, search, namespace, task, page.limit, page.offset)
    return _result(raw)


async def get_queue(db: Database, tenant: str, queue: str, partitions: Page) -> dict[str, Any]:
    """The queue's summary, config, groups and one page of partitions; 404 when it does not exist."""
    return _result(await db.fetchval(calls.RESOURCES_QUEUE, tenant, queue, partitions.limit, partitions.offset), queue)


async def queue_depth(db: Database, tenant: str, queue: str, group: str | None, page: Page) -> dict[str, Any]:
    raw = await db.fetchval(calls.RESOURCES_QUEUE_DEPTH, tenant, queue, group, page.limit, page.offset)
    result = _result(raw, queue, group)
    if result.get("group") == QUEUE_MODE:
        result["group"] = None
        result["queueMode"] = True
    return result


async def list_partitions(db: Database, tenant: str, queue: str | None, page: Page) -> dict[str, Any]:
    return _result(await db.fetchval(calls.RESOURCES_PARTITIONS, tenant, queue, page.limit, page.offset), queue)


async def list_tags(db: Database, tenant: str, kind: Literal["namespace", "task"], page: Page) -> dict[str, Any]:
    return _result(await db.fetchval(calls.RESOURCES_TAGS, tenant, kind, page.limit, page.offset))


async def refresh_stats(db: Database, tenant: str) -> dict[str, Any]:
    """Recompute the tenant's overview counts now (waits for a snapshot tick in progress)."""
    refreshed = await db.fetchval(calls.TENANT_SNAPSHOT, tenant)
    as_of = await db.fetchval(calls.TENANT_SNAPSHOT_AS_OF, tenant)
    return {"success": True, "refreshed": bool(refreshed), "asOf": as_of}


async def status(db: Database, tenant: str) -> dict[str, Any]:
    return _result(await db.fetchval(calls.STATUS, tenant))


async def status_queues(db: Database, tenant: str, window: Window, page: Page) -> dict[str, Any]:
    raw = await db.fetchval(calls.STATUS_QUEUES, tenant, window.since, window.until, page.limit, page.offset)
    return _result(raw)


async def status_queue(db: Database, tenant: str, queue: str, window: Window) -> dict[str, Any]:
    raw = await db.fetchval(calls.STATUS_QUEUE, tenant, queue, window.since, window.until, window.bucket_seconds)
    return _result(raw, queue)


async def analytics(db: Database, tenant: str, queue: str | None, window: Window) -> dict[str, Any]:
    raw = await db.fetchval(calls.ANALYTICS, tenant, queue, window.since, window.until, window.bucket_seconds)
    return _result(raw, queue)


async def lagging_groups(db: Database, tenant: str, min_lag_seconds: int, page: Page) -> dict[str, Any]:
    return _result(await db.fetchval(calls.GROUPS_LAGGING, tenant, min_lag_seconds, page.limit, page.offset))
