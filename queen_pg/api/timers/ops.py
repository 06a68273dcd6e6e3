"""Validation and payload decoding of timer operations (docs/wire.md#timers).

``prepare_timer_ops`` and ``decode_payloads`` are shared by ``POST /api/v1/timers`` and the ``timers`` rider
of ``POST /api/v1/transaction``. They return the ops normalized for ``queen._timer_apply`` (which trusts
them) plus, index-aligned, each op's payload as JSON bytes, the xxh3-128 hash of its ``txn`` and a
freshly minted message id. A refusal is a :class:`QueenError` of kind ``TIMERS_BAD_REQUEST`` whose
message names ``<label>[<index>].<field>``, with ``fields["reason"]`` a stable id: ``bad_field``,
``missing_field``, ``unknown_field``, ``unknown_op``, ``server_owned``, ``too_long``, ``bad_base64``,
``bad_zstd``, ``not_json``, ``too_large``, ``duplicate_key``, ``too_many_ops``. The payloads of one call
decode to at most ``QUEEN_MAX_DECODED_BYTES`` together (413 ``decoded_too_large``, api/decoded.py).

Decisions: ``cancel`` is accepted in both places (the client's ``Timers.batch`` documents it as
accepted by the broker; its own cancel uses the DELETE route); unknown fields are refused, so a typo
such as ``delay_ms`` is a 400 rather than a silent default; a missing ``txn`` is minted here (the
result carries it back).
"""

from __future__ import annotations

import base64
import binascii
import math
import uuid
from dataclasses import dataclass, field
from typing import Any

import zstandard

from queen_pg import text
from queen_pg.api.shared import decoded
from queen_pg.api.shared.body import MAX_TXN_BYTES
from queen_pg.api.shared.params import check_name
from queen_pg.engine import codec, json_check
from queen_pg.errors import TIMERS_BAD_REQUEST, QueenError

MAX_OPS = 1000
MAX_TIMER_KEY_BYTES = 1024
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024  # decoded (and decompressed) JSON
MAX_DELAY_MS = 100 * 366 * 24 * 3600 * 1000  # a century either way

# Fields the server owns (docs/wire.md#timers; the client's queen/timers/ops.py SERVER_OWNED), plus any
# `tenant...` and any field starting with `_`.
SERVER_OWNED = frozenset(
    {
        "producerSub",
        "producer_sub",
        "messageId",
        "message_id",
        "deliverAt",
        "deliver_at",
        "delaySeconds",
        "delay_seconds",
        "attempts",
        "claimToken",
        "claim_token",
        "claimedUntil",
        "claimed_until",
    }
)
_FIELDS: dict[str, frozenset[str]] = {
    "schedule": frozenset({"op", "queue", "timerKey", "payload", "delayMs", "txn", "partition", "payloadZstd"}),
    "reschedule": frozenset({"op", "queue", "timerKey", "payload", "delayMs", "txn", "partition", "payloadZstd"}),
    "cancel": frozenset({"op", "queue", "timerKey", "txn"}),
}


@dataclass(slots=True)
class PreparedTimers:
    """Validated timer ops, index-aligned. For a ``cancel`` the payload is empty and the message id
    unused; its hash is that of its ``txn`` (or of "" when none is given)."""

    ops: list[dict[str, Any]] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)  # filled by decode_payloads
    encoded: list[Encoded | None] = field(default_factory=list)  # as sent (None: a cancel)
    hashes: list[uuid.UUID] = field(default_factory=list)
    message_ids: list[uuid.UUID] = field(default_factory=list)


def refuse(reason: str, detail: str, **fields: Any) -> QueenError:
    return QueenError(TIMERS_BAD_REQUEST, detail=detail, reason=reason, **fields)


def check_queue_name(value: str, where: str, what: str = "queue", index: int | None = None) -> str:
    """A queue (or partition) name by the rules of a push (``check_name``), refused as a timers 400."""
    try:
        return check_name(what, value)
    except QueenError as err:
        reason = "too_long" if err.status == 413 else "bad_field"
        raise refuse(reason, f"{where}: {err}", index=index, field=what) from None


def check_timer_key(value: str, where: str, index: int | None = None) -> str:
    """Non-empty, at most MAX_TIMER_KEY_BYTES of UTF-8, no control character (docs/wire.md#text); ``/`` is fine."""
    if not value:
        raise refuse("missing_field", f"{where}: must be a non-empty string", index=index, field="timerKey")
    size = len(value.encode())
    if size > MAX_TIMER_KEY_BYTES:
        raise refuse(
            "too_long", f"{where}: is {size} bytes; the limit is {MAX_TIMER_KEY_BYTES}", index=index, field="timerKey"
        )
    if text.has_control(value):
        raise refuse("bad_field", f"{where}: {text.MESSAGE}", index=index, field="timerKey")
    return value


def is_server_owned(name: str) -> bool:
    return name in SERVER_OWNED or name.startswith(("_", "tenant"))


class _Op:
    """Field checks of one op; every refusal names ``<label>[<index>].<field>``."""

    def __init__(self, label: str, index: int, op: dict[str, Any]) -> None:
        self.where = f"{label}[{index}]"
        self.index = index
        self.op = op

    def fail(self, reason: str, name: str | None, message: str) -> QueenError:
        where = f"{self.where}.{name}" if name else self.where
        return refuse(reason, f"{where}: {message}", index=self.index, field=name)

    def string(self, name: str, *, required: bool = True) -> str | None:
        v = self.op.get(name)
        if v is None:
            if required:
                raise self.fail("missing_field", name, "is required")
            return None
        if not isinstance(v, str) or not v:
            raise self.fail("bad_field", name, "must be a non-empty string")
        return v

    def name(self, name: str, *, required: bool = True) -> str | None:
        """A queue or partition name: the rules of a push (``check_name``), answered as a timers 400."""
        v = self.string(name, required=required)
        return None if v is None else check_queue_name(v, f"{self.where}.{name}", name, self.index)

    def timer_key(self) -> str:
        v = self.string("timerKey")
        assert v is not None  # required
        return check_timer_key(v, f"{self.where}.timerKey", self.index)

    def txn(self, *, required: bool) -> str | None:
        v = self.string("txn", required=required)
        if v is not None and len(v.encode()) > MAX_TXN_BYTES:
            raise self.fail("too_long", "txn", f"is {len(v.encode())} bytes; the limit is {MAX_TXN_BYTES}")
        if v is not None and text.has_control(v):
            raise self.fail("bad_field", "txn", text.MESSAGE)
        return v

    def delay_ms(self) -> int:
        v = self.op.get("delayMs")
        if v is None:
            raise self.fail("missing_field", "delayMs", "is required (milliseconds from now; negative = now)")
        if isinstance(v, bool) or not isinstance(v, int | float) or (isinstance(v, float) and not math.isfinite(v)):
            raise self.fail("bad_field", "delayMs", f"must be a number of milliseconds, got {v!r}")
        ms = math.floor(v)
        if abs(ms) > MAX_DELAY_MS:
            raise self.fail("bad_field", "delayMs", f"must be within ±{MAX_DELAY_MS} ms, got {ms}")
        return ms

    def payload(self) -> Encoded:
        """The payload as sent (checked to be a string): :func:`decode_payloads` decodes it."""
        raw = self.op.get("payload")
        if raw is None:
            raise self.fail("missing_field", "payload", "is required (base64 of the JSON payload)")
        if not isinstance(raw, str):
            raise self.fail("bad_field", "payload", "must be a base64 string")
        zstd = self.op.get("payloadZstd", False)
        if not isinstance(zstd, bool):
            raise self.fail("bad_field", "payloadZstd", f"must be true or false, got {zstd!r}")
        return Encoded(raw, zstd)


@dataclass(slots=True)
class Encoded:
    """A schedule's payload as sent: base64 text, of zstd frames when ``zstd``."""

    text: str
    zstd: bool

    def declared(self) -> int:
        """What it decodes to, as far as can be told without decoding it: base64's 3 bytes per 4, or
        what its first zstd frame declares (0 when it declares nothing)."""
        if not self.zstd:
            return len(self.text) // 4 * 3 - self.text[-2:].count("=")
        try:
            head = base64.b64decode(self.text[: decoded.FRAME_HEADER_MAX * 4 // 3], validate=True)
        except (binascii.Error, ValueError):
            return 0
        return decoded.declared_size(head) or 0


def _b64(text: str) -> bytes | None:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def _json_payload(data: bytes) -> bool:
    return len(data) <= MAX_PAYLOAD_BYTES and is_json(data)


async def decode_payloads(prepared: PreparedTimers, exp: decoded.Expansion, *, in_transaction: bool) -> None:
    """Decode the payloads of ``prepared`` (base64, then zstd) into ``prepared.payloads``, each checked
    as JSON. The bytes they decode to are counted and charged by ``exp`` before they exist: what they
    declare, all together, is refused at once when it passes the cap."""
    label = "timers" if in_transaction else "operations"
    declared = sum(e.declared() for e in prepared.encoded if e is not None)
    exp.check(declared, f"the payloads of {label}")
    payloads: list[bytes] = []
    for i, enc in enumerate(prepared.encoded):
        if enc is None:  # a cancel
            payloads.append(b"")
            continue
        c = _Op(label, i, {})
        data = await decoded.off_loop(len(enc.text), _b64, enc.text)
        if data is None:
            raise c.fail("bad_base64", "payload", "is not valid base64")
        if enc.zstd:
            try:
                data = await exp.inflate(data, f"{c.where}.payload")
            except zstandard.ZstdError as err:
                raise c.fail("bad_zstd", "payload", f"payloadZstd is set but the bytes are not zstd: {err}") from None
        else:
            await exp.reserve(len(data), f"{c.where}.payload")
        if len(data) > MAX_PAYLOAD_BYTES:
            raise c.fail("too_large", "payload", f"is {len(data)} bytes; the limit is {MAX_PAYLOAD_BYTES}")
        if not await decoded.off_loop(len(data), _json_payload, data):
            raise c.fail(
                "not_json",
                "payload",
                "does not decode to a JSON document (UTF-8) that can be stored exactly (integers within 64 bits, "
                "no U+0000)",
            )
        payloads.append(data)
    prepared.payloads = payloads


def is_json(data: bytes) -> bool:
    """Whether ``data`` is one JSON document in UTF-8 that comes back exactly once stored (RFC 8259;
    no NaN/Infinity, no BOM, integers within 64 bits, no U+0000: a fired timer is a message, and a
    message's payload may be copied into jsonb when it is dead-lettered). A big one is checked without
    being built (engine/json_check.py): a few KiB of zstd could otherwise become gigabytes of objects."""
    try:
        json_check.check(data, nul_ok=False)
    except (ValueError, TypeError):
        return False
    return True


def _check_op(label: str, index: int, raw: object) -> tuple[dict[str, Any], Encoded | None]:
    if not isinstance(raw, dict):
        raise refuse("bad_field", f"{label}[{index}]: must be an object", index=index)
    kind = raw.get("op")
    if kind not in _FIELDS:
        raise refuse(
            "unknown_op",
            f"{label}[{index}].op: must be one of {', '.join(_FIELDS)}, got {kind!r}",
            index=index,
        )
    c = _Op(label, index, raw)
    owned = sorted(k for k in raw if is_server_owned(k))
    if owned:
        raise c.fail(
            "server_owned",
            owned[0],
            "is server-owned and cannot be supplied (the broker mints message ids, computes deliverAt from "
            "delayMs and takes the tenant and producer from the request)",
        )
    unknown = sorted(set(raw) - _FIELDS[kind])
    if unknown:
        raise c.fail("unknown_field", unknown[0], f"unknown field for op {kind!r}")
    queue = c.name("queue")
    key = c.timer_key()
    if kind == "cancel":
        return {"op": "cancel", "queue": queue, "timerKey": key, "txn": c.txn(required=False)}, None
    partition = c.name("partition", required=False) or "Default"
    op = {
        "op": kind,
        "queue": queue,
        "timerKey": key,
        "partition": partition,
        "delayMs": c.delay_ms(),
        "txn": c.txn(required=False) or str(codec.uuid7()),
    }
    return op, c.payload()


def prepare_timer_ops(ops: object, *, in_transaction: bool) -> PreparedTimers:
    """Validate ``ops`` (the body's ``operations``, or a transaction's ``timers``) for SQL; their payloads
    are decoded next, by :func:`decode_payloads`."""
    label = "timers" if in_transaction else "operations"
    if not isinstance(ops, list):
        raise refuse("bad_field", f"{label}: must be a list of timer operations")
    if len(ops) > MAX_OPS:
        raise refuse("too_many_ops", f"{label}: {len(ops)} operations; the limit is {MAX_OPS}")
    out = PreparedTimers()
    seen: dict[tuple[str, str], int] = {}
    for i, raw in enumerate(ops):
        op, payload = _check_op(label, i, raw)
        where = (op["queue"], op["timerKey"])
        if where in seen:
            raise refuse(
                "duplicate_key",
                f"{label}[{i}]: queue {where[0]!r} timer key {where[1]!r} is already used by {label}[{seen[where]}]; "
                "one timer operation per queue and timer key per call",
                index=i,
            )
        seen[where] = i
        out.ops.append(op)
        out.encoded.append(payload)
        out.hashes.append(codec.txn_hash(op["txn"] or ""))
        out.message_ids.append(codec.uuid7())
    return out
