"""Consumer-group administration (docs/wire.md#admin): list, inspect, delete, seek, re-subscribe.

The queue-mode group is addressed as ``__QUEUE_MODE__`` in paths and shown as ``"name": null,
"queueMode": true`` in answers. POSTs never require a body (the client sends none when its options
are empty, docs/wire.md#empty-posts); what a body must say is checked after an empty one is read as ``{}``.
Path names are URL-decoded by the router; a group or queue name containing ``/`` cannot be addressed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg.api.shared.body import read
from queen_pg.api.shared.common import check_name, json_response, state, tenant
from queen_pg.api.shared.docs import answers, body, params
from queen_pg.api.shared.params import Param, page, parse_timestamp, read_page, time_schema
from queen_pg.api.shared.reads import db_tenant, read_route
from queen_pg.api.shared.schemas_browse import GroupDeleted, GroupDetail, GroupList, SeekAnswer, SubscriptionAnswer
from queen_pg.engine import groups as group_engine
from queen_pg.errors import bad_request
from queen_pg.security.access import level
from queen_pg.security.roles import Level

router = APIRouter(prefix="/api/v1/consumer-groups")
Endpoint = TypeVar("Endpoint", bound=Callable[..., Awaitable[Response]])

DEFAULT_PAGE = 100
MAX_PAGE = 1000
SUBSCRIPTION_NOTE = (
    "cursors were not moved: the timestamp is the group's subscription rule, used when its cursors are "
    "recreated (DELETE /api/v1/consumer-groups/{group}?deleteMetadata=false); seek moves cursors"
)


Timestamp = Annotated[
    str, msgspec.Meta(extra_json_schema=time_schema(True), description="RFC 3339 with a zone, or `now`")
]
_ONE_TARGET: dict[str, Any] = {
    "oneOf": [
        {"required": ["toEnd"], "properties": {"toEnd": {"const": True}}},
        {"required": ["toStart"], "properties": {"toStart": {"const": True}}},
        {"required": ["timestamp"], "properties": {"timestamp": {"type": "string"}}},
    ]
}


class SeekBody(msgspec.Struct, forbid_unknown_fields=True):
    """Exactly one target: ``toEnd: true``, ``toStart: true`` or ``timestamp``; the schema's ``oneOf`` says so,
    and ``_seek`` checks it (a schema constraint msgspec does not evaluate)."""

    toEnd: bool | None = None
    toStart: bool | None = None
    timestamp: Timestamp | None = None


class SubscriptionBody(msgspec.Struct, forbid_unknown_fields=True):
    subscriptionTimestamp: Timestamp


DELETE_METADATA = Param(
    "deleteMetadata",
    "true: forget the group's subscription too; false: keep it and recreate the cursors from it at once",
    "bool",
    True,
)
PAGE = page(DEFAULT_PAGE, MAX_PAGE)
DELETE_DESCRIPTION = "Live leases on the deleted cursors are broken. 404 when the group (or the queue) is unknown."
SEEK_DESCRIPTION = (
    'Exactly one target: `{"toEnd": true}`, `{"toStart": true}` (the first retained message) or '
    '`{"timestamp": "<ISO-8601 with zone>" | "now"}` (the first message written at or after it). Moved '
    "cursors drop their leases and retry counts. An empty body reads as `{}` and is refused with 400."
)


@read_route(
    router,
    "",
    GroupList,
    summary="List consumer groups per queue, with lag and leases (paginated)",
    query=PAGE,
    errors=(400,),
)
async def list_groups(request: Request) -> Any:
    return await group_engine.list_groups(*db_tenant(request), *read_page(request, PAGE))


@read_route(
    router,
    "/{group}",
    GroupDetail,
    summary="A consumer group's cursors, lag and leases per queue and partition",
    errors=(400, 404, 413),
)
async def get_group(request: Request, group: str) -> Any:
    check_name("consumer group", group)
    return await group_engine.get_group(*db_tenant(request), group)


def _admin_route(
    method: str, path: str, summary: str, description: str, extra: dict[str, Any], answer: Any
) -> Callable[[Endpoint], Endpoint]:
    """A group-changing route (admin level) answering ``answer`` or 400/404/413."""

    def register(endpoint: Endpoint) -> Endpoint:
        route = router.api_route(
            path,
            methods=[method],
            summary=summary,
            description=description,
            openapi_extra=extra,
            responses=answers({200: answer}, 400, 404, 413),
        )
        return route(level(Level.ADMIN)(endpoint))

    return register


def _delete_route(path: str, summary: str) -> Callable[[Endpoint], Endpoint]:
    return _admin_route("DELETE", path, summary, DELETE_DESCRIPTION, params(DELETE_METADATA), GroupDeleted)


def _seek_route(path: str, summary: str) -> Callable[[Endpoint], Endpoint]:
    return _admin_route("POST", path, summary, SEEK_DESCRIPTION, body(SeekBody, schema_extra=_ONE_TARGET), SeekAnswer)


@_delete_route("/{group}/queues/{queue}", "Delete a consumer group's cursors on one queue")
async def delete_group_on_queue(request: Request, group: str, queue: str) -> Response:
    check_name("consumer group", group)
    check_name("queue", queue)
    return await _delete(request, group, queue)


@_delete_route("/{group}", "Delete a consumer group's cursors on every queue")
async def delete_group(request: Request, group: str) -> Response:
    check_name("consumer group", group)
    return await _delete(request, group, None)


async def _delete(request: Request, group: str, queue: str | None) -> Response:
    delete_metadata: bool = DELETE_METADATA.read(request)
    st = state(request)
    ten = tenant(request)
    result = await group_engine.delete_group(st.db, ten, group, queue, delete_metadata)
    if not delete_metadata:  # cursors were recreated: parked pops of the group may have work again
        for q in result.get("queues") or ():
            st.waiters.notify(ten, q["queue"])
    return json_response(result)


@_seek_route("/{group}/queues/{queue}/seek", "Move a group's cursors on a queue: end, start or time")
async def seek_queue(request: Request, group: str, queue: str) -> Response:
    return await _seek(request, group, queue, None)


@_seek_route(
    "/{group}/queues/{queue}/partitions/{partition}/seek", "Move a group's cursor on one partition: end, start or time"
)
async def seek_partition(request: Request, group: str, queue: str, partition: str) -> Response:
    check_name("partition", partition)
    return await _seek(request, group, queue, partition)


async def _seek(request: Request, group: str, queue: str, partition: str | None) -> Response:
    check_name("consumer group", group)
    check_name("queue", queue)
    body = await read(request, SeekBody, empty_ok=True)
    chosen = [name for name, on in (("toEnd", body.toEnd), ("toStart", body.toStart)) if on]
    if body.timestamp is not None:
        chosen.append("timestamp")
    if len(chosen) != 1:
        given = f"; got {', '.join(chosen)}" if chosen else ""
        raise bad_request(
            'seek needs exactly one target: {"toEnd": true}, {"toStart": true} or '
            '{"timestamp": "<ISO-8601 with zone>"}' + given
        )
    target: group_engine.SeekTarget = "end" if body.toEnd else "start" if body.toStart else "timestamp"
    ts = parse_timestamp("timestamp", body.timestamp, now_ok=True) if body.timestamp is not None else None
    st = state(request)
    ten = tenant(request)
    result = await group_engine.seek(st.db, ten, group, queue, partition, target, ts)
    st.waiters.notify(ten, queue)  # a seek back makes the partitions claimable at once
    return json_response(result)


@router.post(
    "/{group}/subscription",
    summary="Set the group's subscription timestamp (cursors do not move)",
    description="Records the timestamp (ISO-8601 with a zone, or `now`) on every queue of the group; it is "
    "used when the group's cursors are recreated (DELETE ...?deleteMetadata=false). An empty body reads as "
    "`{}` and is refused (400: subscriptionTimestamp is required).",
    openapi_extra=body(SubscriptionBody),
    responses=answers({200: SubscriptionAnswer}, 400, 404, 413),
)
@level(Level.ADMIN)
async def set_subscription(request: Request, group: str) -> Response:
    check_name("consumer group", group)
    body = await read(request, SubscriptionBody, empty_ok=True)
    ts = parse_timestamp("subscriptionTimestamp", body.subscriptionTimestamp, now_ok=True)
    st = state(request)
    result = await group_engine.set_subscription(st.db, tenant(request), group, ts)
    return json_response({**result, "note": SUBSCRIPTION_NOTE})
