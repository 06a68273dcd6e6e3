"""POST /api/v1/transaction: acks, pushes, KV and timers committed together (docs/wire.md#transaction)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import Field

from queen_pg.api.kv.body import TxKvOp
from queen_pg.api.kv.ops import validate_kv_ops
from queen_pg.api.kv.schemas import KvResult
from queen_pg.api.shared import admission, binary, decoded, item_limit, raw_fields
from queen_pg.api.shared.body import LeaseId, decode
from queen_pg.api.shared.common import (
    answer_budget,
    check_name,
    json_response,
    max_items,
    permit,
    producer_sub,
    refuse_when_storage_full,
    state,
    tenant,
    wake_pushed,
)
from queen_pg.api.shared.docs import answers, body
from queen_pg.api.shared.envelope import plain_ops
from queen_pg.api.shared.gates import refuse_push_in_maintenance
from queen_pg.api.shared.items import AckItem, PushItem, new_messages
from queen_pg.api.shared.request_key import replay_headers, request_once
from queen_pg.api.shared.schemas import REQUEST_KEY, AckResult, Answer, PushResult
from queen_pg.api.timers.body import TimerOp
from queen_pg.api.timers.ops import decode_payloads, prepare_timer_ops
from queen_pg.api.timers.schemas import TimerResult
from queen_pg.engine import transaction as tx_engine
from queen_pg.errors import Verdict, bad_request
from queen_pg.security.access import level
from queen_pg.security.roles import Level

router = APIRouter(prefix="/api/v1")

MAX_KV_OPS = 64
MAX_KV_KEYS = 256
KV_WRITES = {"put", "putIfAbsent", "delete", "incr"}


class TxAckOp(AckItem, tag="ack", tag_field="type"):
    """An ack of the transaction: the one ack item of POST /api/v1/ack, tagged ``"type": "ack"``."""


class TxPushOp(msgspec.Struct, tag="push", tag_field="type"):
    items: Annotated[list[PushItem], msgspec.Meta(min_length=1)]


class TransactionRequest(msgspec.Struct):
    """``kv`` and ``timers`` are top-level arrays (not operations). The ops are as POST /api/v1/kv
    (no getPrefix) and POST /api/v1/timers take them."""

    operations: list[TxAckOp | TxPushOp] = []
    requiredLeases: list[LeaseId] = []
    kv: list[TxKvOp] | None = None
    timers: list[TimerOp] | None = None


def _planner_limits(kv: list[Any], timers: list[Any]) -> None:
    """Limits of one call (the design): refused whole, as a 200 verdict like the other rollbacks."""
    if len(kv) > MAX_KV_OPS:
        raise Verdict("too_large", {"error": f"a transaction holds at most {MAX_KV_OPS} KV operations, got {len(kv)}"})
    keys: set[tuple[Any, Any]] = set()
    written: set[tuple[Any, Any]] = set()
    for i, op in enumerate(kv):
        if not isinstance(op, dict):
            continue  # the validator gives the 400
        ns = op.get("ns")
        many = op.get("keys")
        names: list[Any] = many if isinstance(many, list) else [op.get("key")]
        keys.update((ns, k) for k in names)
        if op.get("op") in KV_WRITES:
            if (ns, op.get("key")) in written:
                raise Verdict(
                    "bad_request",
                    {"failedIndex": i, "error": f"kv[{i}]: one write per key per transaction ({ns}/{op.get('key')})"},
                )
            written.add((ns, op.get("key")))
    if len(keys) > MAX_KV_KEYS:
        raise Verdict("too_large", {"error": f"a transaction touches at most {MAX_KV_KEYS} KV keys, got {len(keys)}"})
    seen: set[tuple[Any, Any]] = set()
    for i, op in enumerate(timers):
        if isinstance(op, dict):
            key = (op.get("queue"), op.get("timerKey"))
            if key in seen:
                raise Verdict(
                    "bad_request",
                    {"error": f"timers[{i}]: one timer operation per queue and timer key per transaction"},
                )
            seen.add(key)


# --- transaction answers -------------------------------------------------------------------------


class TxAckResult(AckResult):
    type: Literal["ack"]


class TxPushResult(PushResult):
    type: Literal["push"]


class TransactionDone(Answer):
    transactionId: str
    success: Literal[True]
    results: list[TxAckResult | TxPushResult | KvResult | TimerResult] = Field(
        description="one per flat index: the operations (each ack one slot, each push item one), then kv, then timers"
    )


class TransactionVerdict(Answer):
    """Nothing was written. ``kv_precondition`` is returned by the client (a falsy result); any other
    reason (``rejected_ack``, ``duplicate``, ``too_large``, ``bad_request``) is raised with ``error``."""

    success: Literal[False]
    reason: str
    error: str
    failedIndex: int | None = None
    kvReason: str | None = Field(None, description="with kv_precondition: version, exists, absent, limit, type")
    version: int | None = None
    value: Any = None


@router.post(
    "/transaction",
    summary="Commit acks, pushes, KV writes and timers as one transaction",
    description="All or nothing. A refusal decided under locks is a 200 verdict `{success: false, reason, error, "
    "...}` with nothing written: `kv_precondition` (a lost `required` KV condition; `failedIndex` is the flat "
    "index: operations (each ack and each push item one slot), then kv, then timers), `rejected_ack`, "
    "`duplicate`, `too_large`. The KV results have the answer budget of POST /api/v1/kv (QUEEN_MAX_ANSWER_BYTES): "
    "a transaction whose KV reads would answer more is 413 `answer_too_large`, nothing written. 503 `maintenance` "
    "when it pushes under push maintenance, 507 `storage_full` when it pushes while storage is full.",
    openapi_extra=binary.documented(body(TransactionRequest, parameters=REQUEST_KEY)),
    responses=answers({200: TransactionDone | TransactionVerdict}, 400, 413, 422, 429, 507),
)
@level(Level.READ_WRITE)
async def transaction(request: Request) -> Response:
    # what the body decodes to (zstd groups, timer payloads) is held in the admission budget until answered
    async with decoded.expansion(request, "transaction") as exp:
        if binary.is_binary(request):  # QTB1 (docs/wire.md#binary-transaction): the JSON head, then framed pushes
            head, framed = await binary.transaction_body(request, exp)
            return await _commit(request, head if head.strip() else b"{}", framed, exp)
        raw = await request.body()
        if not raw.strip():
            raise bad_request("request body is empty; a JSON object is required")
        return await _commit(request, raw, None, exp)


class _Riders(msgspec.Struct):
    """The riders as plain JSON; the operations (pushed payloads) are skipped, not decoded again."""

    kv: list[Any] | None = None
    timers: list[Any] | None = None


class _RawRiders(msgspec.Struct):
    """The riders of a big body (api/shared/raw_fields.py): each KV op field by field."""

    kv: list[dict[str, msgspec.Raw]] | None = None
    timers: list[Any] | None = None


_riders = msgspec.json.Decoder(_Riders)
_raw_riders = msgspec.json.Decoder(_RawRiders)


def _plain_riders(raw: bytes, body: TransactionRequest) -> _Riders:
    """The riders as plain JSON; a big body's KV values are the ``Prepared`` its Struct holds."""
    if not (body.kv or body.timers):
        return _Riders()
    if len(raw) < raw_fields.BIG_BODY:
        return _riders.decode(raw)
    riders = _raw_riders.decode(raw)
    kv = plain_ops(riders.kv, body.kv or ()) if riders.kv is not None else None
    return _Riders(kv, riders.timers)


def _items(body: TransactionRequest) -> int:
    """The items of a decoded transaction (QUEEN_MAX_ITEMS): each ack, pushed message, KV and timer op."""
    n = len(body.kv or ()) + len(body.timers or ())
    for op in body.operations:
        n += len(op.items) if isinstance(op, TxPushOp) else 1
    return n


async def _commit(request: Request, raw: bytes, framed: binary.FramedPushes | None, exp: decoded.Expansion) -> Response:
    """Run a transaction body; ``framed`` = a QTB1 body's pushes, after the head's operations."""
    cap = max_items(request)
    item_limit.check_transaction(raw, cap)  # before anything is decoded
    body = decode(raw, TransactionRequest)
    items = _items(body) + (len(framed.items) if framed is not None else 0)
    if items > cap:  # the head's items and the framed pushes together; nothing built yet
        raise item_limit.too_many(item_limit.TRANSACTION, cap, items)
    await admission.charge_items(request.scope, items)  # held until answered, as the body's bytes
    acks: list[tx_engine.TxAck] = []
    pushes: list[tx_engine.TxPush] = []
    slot = 0
    for n, op in enumerate(body.operations):
        if isinstance(op, TxAckOp):
            status = op.status.lower()
            if op.group is not None:
                check_name("consumerGroup", op.group)
            acks.append(tx_engine.TxAck(slot, op.transaction_id, str(op.partition_id), status, op.group, op.lease_id))
            slot += 1
        else:
            for msg in new_messages(op.items, f"operations.{n}.items", producer_sub(request)):
                pushes.append(tx_engine.TxPush(slot, msg))
                slot += 1
    packed = None
    if framed is not None:
        # the blobs as segments, unless the head pushes too (then every push is packed as JSON's are)
        packed = None if pushes else framed.prepared
        for msg in framed.items:
            pushes.append(tx_engine.TxPush(slot, msg))
            slot += 1
    riders = _plain_riders(raw, body)
    kv_raw: list[Any] = riders.kv or []  # as plain JSON (integers exact) for the semantic checks
    timers_raw: list[Any] = riders.timers or []
    st = state(request)
    try:
        _planner_limits(kv_raw, timers_raw)
        kv = validate_kv_ops(kv_raw, in_transaction=True) if kv_raw else []
        prepared = prepare_timer_ops(timers_raw, in_transaction=True) if timers_raw else None
    except Verdict as v:
        return json_response({"success": False, "reason": v.reason, **v.detail})
    if not (acks or pushes or kv or (prepared and prepared.ops)):
        return json_response({"transactionId": "", "success": True, "results": []})  # nothing to commit
    refuse_push_in_maintenance(request, bool(pushes))  # 503; acks, KV and timers alone still commit
    if prepared is not None:
        await decode_payloads(prepared, exp, in_transaction=True)
    timers = tx_engine.TxTimers()
    if prepared is not None:
        timers = tx_engine.TxTimers(
            prepared.ops, prepared.payloads, prepared.hashes, prepared.message_ids, producer_sub(request)
        )
    if pushes:
        refuse_when_storage_full(request)  # 507; a transaction of acks and KV still drains the backlog
    bundle = tx_engine.TxBundle(acks, pushes, body.requiredLeases, kv, timers, slot, packed)
    once = await request_once(request, "transaction")  # a keyed transaction commits once
    async with permit(request, "transaction"):
        answer, wake = await tx_engine.commit(st.db, tenant(request), bundle, once, answer_budget(request))
    wake_pushed(st, tenant(request), wake)  # the pushed queues, and those its acks left claimable
    if framed is not None and framed.counts_only:
        answer = binary.counted(answer, len(acks) + len(pushes))
    return json_response(answer, headers=replay_headers(once))
