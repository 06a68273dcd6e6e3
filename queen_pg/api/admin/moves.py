"""The two 0.x admin calls still in use (docs/wire.md#legacy-admin): routes, their body and answers.

* ``POST /api/v1/messages/{partitionId}/{transactionId}/dlq`` dead-letters one message now for ONE
  consumer group: ``consumerGroup`` (query parameter or body field; the query wins), default queue
  mode. A dead letter belongs to a group (each group keeps its own cursor and retry budget), so the
  other groups still read the message. The 0.x client posts ``{}``; ``error`` (body) is the reason
  the dead letter shows (default: "moved to the dead-letter queue by an operator").
* ``DELETE /api/v1/queues/{queue}/clear[?partition=p]`` drops every message of the queue (or of one
  partition) and keeps the queue, its configuration, partitions and groups; see
  ``sql/procedures/075_admin_clear.sql`` for cursors and leases.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import Field

from queen_pg import text
from queen_pg.api.shared import params as P
from queen_pg.api.shared.body import Name, read
from queen_pg.api.shared.common import json_response, state, tenant
from queen_pg.api.shared.docs import answers, body
from queen_pg.api.shared.params import message_key
from queen_pg.api.shared.schemas import Answer
from queen_pg.engine import admin_moves
from queen_pg.errors import bad_request
from queen_pg.security.access import level
from queen_pg.security.roles import Level

router = APIRouter(prefix="/api/v1")

MAX_ERROR_BYTES = 4096
GROUP = P.Param("consumerGroup", "the group to dead-letter it for (wins over the body's); default queue mode")
PARTITION = P.Param("partition", "clear only this partition (by name)")
# the byte limit is checked in the route; the schema states it in characters (what JSON Schema counts)
DlqError = Annotated[
    str,
    msgspec.Meta(
        pattern=text.FREE_TEXT_PATTERN,
        description=f"the dead letter's error message, at most {MAX_ERROR_BYTES} bytes of UTF-8",
        extra_json_schema={"maxLength": MAX_ERROR_BYTES},
    ),
]


class MoveToDlqBody(msgspec.Struct):
    """Optional: the 0.x client sends ``{}`` (or nothing)."""

    consumerGroup: Annotated[Name, msgspec.Meta(description="the group (default queue mode)")] | None = None
    error: DlqError | None = None


class MovedToDlq(Answer):
    success: bool
    status: str = Field(description="`moved`")
    transactionId: str
    queue: str
    partition: str
    partitionId: str
    consumerGroup: str | None = Field(description="null: queue mode")
    queueMode: bool
    offset: int
    messageId: str
    leaseReleased: bool = Field(description="the group's lease covered only settled messages now and was released")


class QueueCleared(Answer):
    success: bool
    status: str = Field(description="`cleared`")
    queue: str
    partition: str | None
    partitions: int = Field(description="partitions cleared (they stay, empty)")
    messagesDropped: int
    deadLettersDropped: int
    leasesBroken: int = Field(description="live leases broken: their holders' acks now find no message")


@router.post(
    "/messages/{partition_id}/{transaction_id:path}/dlq",
    summary="Dead-letter one message now, for one consumer group (0.x admin call; docs/wire.md#legacy-admin)",
    description="As an ack with status `dlq` by that group would: the dead letter is listed by `/dlq`, the "
    "group's cursor moves over the message, other groups are not touched. 404 when the partition, the "
    "group's cursor on it or the message is unknown; 409 `conflict` when the group already completed or "
    "dead-lettered it (nothing written).",
    openapi_extra=body(MoveToDlqBody, required=False, parameters=(GROUP.doc(),)),
    responses=answers({200: MovedToDlq}, 400, 404, 409, 413),
)
@level(Level.ADMIN)
async def move_to_dlq(request: Request, partition_id: str, transaction_id: str) -> Response:
    pid, txn = message_key(partition_id, transaction_id)
    doc = await read(request, MoveToDlqBody, empty_ok=True)
    group = GROUP.read(request) or doc.consumerGroup
    if doc.error is not None and len(doc.error.encode()) > MAX_ERROR_BYTES:
        raise bad_request(f"error must be at most {MAX_ERROR_BYTES} bytes of UTF-8")
    st = state(request)
    return json_response(await admin_moves.move_to_dlq(st.db, tenant(request), pid, txn, group, doc.error))


@router.delete(
    "/queues/{queue}/clear",
    summary="Drop every message of a queue, keep the queue and its configuration (0.x admin call)",
    description="Segments, transactionId hashes and dead letters go; partitions, groups and configuration "
    "stay. Offsets are not reused: every group's cursor moves to the end, so nothing is pending and new "
    "pushes are read as usual. Live leases are broken (their acks find no message). Pending timers stay. "
    "404 for an unknown queue or partition.",
    openapi_extra={"parameters": [PARTITION.doc()]},
    responses=answers({200: QueueCleared}, 400, 404, 413),
)
@level(Level.ADMIN)
async def clear_queue(request: Request, queue: str) -> Response:
    P.check_name("queue", queue)
    partition = PARTITION.read(request)
    st = state(request)
    return json_response(await admin_moves.clear_queue(st.db, tenant(request), queue, partition))
