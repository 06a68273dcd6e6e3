"""Consumer-group administration: list, inspect, delete, seek, re-subscribe; one procedure call each.

The procedures (``sql/procedures/050_groups.sql``) answer an unknown queue, group or partition with
``{"notFound": kind}`` (or NULL); this module turns that into a 404 ``not_found`` QueenError.
Queue mode is the group ``__QUEUE_MODE__``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import orjson

from queen_pg.db.pool import Database
from queen_pg.engine import calls
from queen_pg.engine.pop import not_found

SeekTarget = Literal["end", "start", "timestamp"]


def _result(raw: Any, group: str, queue: str | None = None, partition: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] | None = orjson.loads(raw) if raw is not None else None
    if result is None:
        raise not_found("group", queue, partition, group)
    if "notFound" in result:
        raise not_found(str(result["notFound"]), queue, partition, group)
    return result


async def list_groups(db: Database, tenant: str, limit: int, offset: int) -> dict[str, Any]:
    """Every (queue, group) of the tenant, by group then queue name: ``{consumerGroups, total, ...}``."""
    result: dict[str, Any] = orjson.loads(await db.fetchval(calls.GROUPS_LIST, tenant, limit, offset))
    return result


async def get_group(db: Database, tenant: str, group: str) -> dict[str, Any]:
    """The group's state per queue and per partition; 404 when no queue has it."""
    return _result(await db.fetchval(calls.GROUP_GET, tenant, group), group)


async def delete_group(
    db: Database, tenant: str, group: str, queue: str | None, delete_metadata: bool
) -> dict[str, Any]:
    """Delete the group's cursors on ``queue`` (None: every queue). ``delete_metadata=False`` keeps the
    group's subscription and recreates its cursors from it."""
    return _result(await db.fetchval(calls.GROUP_DELETE, tenant, group, queue, delete_metadata), group, queue)


async def seek(
    db: Database,
    tenant: str,
    group: str,
    queue: str,
    partition: str | None,
    target: SeekTarget,
    timestamp: datetime | None,
) -> dict[str, Any]:
    """Move the group's cursors on ``queue`` (one ``partition``, or all) to the end, the start or a time."""
    raw = await db.fetchval(calls.GROUP_SEEK, tenant, group, queue, partition, target, timestamp)
    return _result(raw, group, queue, partition)


async def set_subscription(db: Database, tenant: str, group: str, subscribed_from: datetime) -> dict[str, Any]:
    """Record ``subscribed_from`` on every queue of the group; cursors do not move."""
    return _result(await db.fetchval(calls.GROUP_SUBSCRIPTION, tenant, group, subscribed_from), group)
