"""Message items of the wire shared by push, ack and the transaction: one declaration each
(docs/wire.md#push, docs/wire.md#ack)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

import msgspec
import orjson

from queen_pg import text
from queen_pg.api.shared import raw_fields
from queen_pg.api.shared.body import MAX_TXN_BYTES, LeaseId, Name, NewTxnId, Text, TxnId, narrow, stored_json
from queen_pg.api.shared.common import (
    check_name,
)
from queen_pg.engine import ack as ack_engine
from queen_pg.engine import push as push_engine
from queen_pg.errors import bad_request

_UUID = r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$"
TraceId = Annotated[str, msgspec.Meta(pattern=_UUID, description="a UUID")]
_STATUS_WORDS = tuple(ack_engine.STATUSES)
# case-insensitive, as clients send it; JSON Schema regexes have no flags, hence [Cc][Oo]...
_STATUS_PATTERN = "^(?:" + "|".join("".join(f"[{c.upper()}{c}]" for c in w) for w in _STATUS_WORDS) + ")$"
AckStatus = Annotated[
    str,
    msgspec.Meta(pattern=_STATUS_PATTERN, description="completed (or success), failed, retry, dlq; any letter case"),
]
# the usual lower-case spellings are checked without a regex per item (any other case: the pattern decides)
narrow(_STATUS_PATTERN, Literal.__getitem__(_STATUS_WORDS))
# An ack names the partition as a pop returned it; anything else is that item's `success: false`
# ("unknown partitionId"), never a refusal of the whole call.
AckPartitionId = Annotated[
    Annotated[str, msgspec.Meta(pattern=text.FREE_TEXT_PATTERN)] | int,
    msgspec.Meta(description="the partition's numeric id as a pop returned it; an unknown one fails the item only"),
]
JSON_VALUE = "any JSON value; integers within 64 bits"


class PushItem(msgspec.Struct):
    """One message. ``payload`` (or ``data``, the 0.x name) is stored as given and must come back exactly."""

    queue: Name
    partition: Name = "Default"
    payload: Annotated[Any, msgspec.Meta(description=JSON_VALUE)] = msgspec.UNSET
    data: Annotated[Any, msgspec.Meta(description="the payload, when `payload` is absent")] = None
    transactionId: NewTxnId | None = None
    traceId: TraceId | None = None


# Decoded under the engine's attribute names (``ack_engine.AckLike``, the wire names as msgspec field
# names) and settled as it is: the route only normalizes it in place (status case, the batch's group, a
# numeric partitionId as text), never copies it into a second object.
class AckItem(msgspec.Struct):
    transaction_id: TxnId = msgspec.field(name="transactionId")
    partition_id: AckPartitionId = msgspec.field(name="partitionId")
    status: AckStatus = "completed"
    error: Text | None = None
    group: Name | None = msgspec.field(default=None, name="consumerGroup")
    lease_id: LeaseId | None = msgspec.field(default=None, name="leaseId")


def new_messages(items: list[PushItem], where: str, producer: str | None = None) -> list[push_engine.NewMessage]:
    """Decoded push items as the engine takes them (also used by the transaction route): ``where`` =
    the items' path in the body (``items``), an error names ``{where}.{i}``. The Struct said
    everything but the byte limits and whether the payload can be stored exactly; each distinct
    (queue, partition) is checked once. ``producer`` = the token's sub (``producer_sub(request)``);
    a body ``producerSub`` is never read."""
    checked: set[tuple[str, str]] = set()
    out: list[push_engine.NewMessage] = []
    unset = msgspec.UNSET
    # a big body's items (api/shared/raw_fields.py) hold their payloads written already
    dumps = raw_fields.dumps if items and type(items[0]) in raw_fields.PREPARED else orjson.dumps
    make = push_engine.NewMessage._make  # a tuple without NamedTuple.__new__'s Python frame
    for i, it in enumerate(items):
        queue, partition, txn = it.queue, it.partition, it.transactionId
        if (queue, partition) not in checked:
            check_name("queue", queue)
            if partition != "Default":
                check_name("partition", partition)
            checked.add((queue, partition))
        if txn is not None and len(txn) * 4 > MAX_TXN_BYTES and len(txn.encode()) > MAX_TXN_BYTES:
            raise bad_request(f"{where}.{i}.transactionId: longer than {MAX_TXN_BYTES} bytes of UTF-8")
        # U+0000 is fine in a payload: it is stored in a segment, not a text column (a dead letter whose
        # payload jsonb refuses is kept by dlq_fill without one)
        value = it.data if it.payload is unset else it.payload
        try:
            payload = dumps(value)
        except orjson.JSONEncodeError:
            payload = stored_json(value, f"{where}.{i}.payload", nul_ok=True)  # raises, worded as for any body
        trace = uuid.UUID(it.traceId) if it.traceId else None
        out.append(make((queue, partition, payload, txn, trace, producer, None)))
    return out
