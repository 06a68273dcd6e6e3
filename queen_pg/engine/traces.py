"""Traces: record an event about a message, read a message's timeline, traces by name, the names.

One procedure call each (``sql/procedures/120_traces.sql``). An unknown partition is a 404
``not_found``; a message with no trace is an empty timeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from queen_pg.db.pool import Database
from queen_pg.engine import calls
from queen_pg.engine.admin import Page
from queen_pg.engine.answers import mark_cut
from queen_pg.errors import NOT_FOUND, QueenError


@dataclass(frozen=True, slots=True)
class TraceEvent:
    partition_id: int
    transaction_id: str
    group: str  # '__QUEUE_MODE__' for queue mode
    names: list[str]
    event_type: str
    data: bytes  # JSON


def _no_partition(partition_id: int) -> QueenError:
    return QueenError(NOT_FOUND, detail=f"partition {partition_id} not found")


async def record(db: Database, tenant: str, ev: TraceEvent) -> dict[str, Any]:
    raw = await db.fetchval(
        calls.TRACE_ADD, tenant, ev.partition_id, ev.transaction_id, ev.group, ev.names, ev.event_type, ev.data.decode()
    )
    result: dict[str, Any] = orjson.loads(raw)
    if result["status"] == "no_partition":
        raise _no_partition(ev.partition_id)
    return result


async def for_message(
    db: Database, tenant: str, partition_id: int, transaction_id: str, page: Page, max_bytes: int | None = None
) -> dict[str, Any]:
    """A message's timeline, oldest first; the page stops at ``max_bytes`` (the answer budget)."""
    raw = await db.fetchval(
        calls.TRACES_FOR_MESSAGE, tenant, partition_id, transaction_id, page.limit, page.offset, max_bytes
    )
    result: dict[str, Any] = orjson.loads(raw)
    if "notFound" in result:
        raise _no_partition(partition_id)
    return mark_cut(result, "traces")


async def by_name(
    db: Database,
    tenant: str,
    name: str,
    since: datetime | None,
    until: datetime | None,
    page: Page,
    max_bytes: int | None = None,
) -> dict[str, Any]:
    """Traces carrying ``name``, newest first; the page stops at ``max_bytes`` (the answer budget)."""
    result: dict[str, Any] = orjson.loads(
        await db.fetchval(calls.TRACES_BY_NAME, tenant, name, since, until, page.limit, page.offset, max_bytes)
    )
    return mark_cut(result, "traces")


async def names(db: Database, tenant: str, search: str | None, page: Page) -> dict[str, Any]:
    result: dict[str, Any] = orjson.loads(await db.fetchval(calls.TRACE_NAMES, tenant, search, page.limit, page.offset))
    return result
