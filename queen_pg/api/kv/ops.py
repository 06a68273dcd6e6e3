"""Validation of KV operations (docs/wire.md#kv) and lock operations (docs/wire.md#locks): the rule.

What a field may hold is declared here once, as the constants below; the Structs of body.py are built
from them (their schema in ``/openapi.json`` states the same rule, their decoding checks the part of it
msgspec can check, with the same constants). Every caller runs these checks, whatever decoded the body.

``validate_kv_ops`` is shared by ``POST /api/v1/kv`` and the ``kv`` rider of
``POST /api/v1/transaction``; ``validate_lock_ops`` serves ``POST /api/v1/locks``. Both return the
ops normalized (only known fields, defaults made explicit where SQL relies on them) for
``queen._kv_apply`` / ``queen.locks_v1``, which trust them. A refusal is a :class:`QueenError` of
kind ``KV_BAD_REQUEST`` / ``LOCKS_BAD_REQUEST`` whose message names the op index and the field, with
``fields["reason"]`` a stable id (``bad_field``, ``missing_field``, ``unknown_field``, ``unknown_op``,
``too_long``, ``too_large``, ``bad_namespace``, ``reserved_namespace``, ``not_in_transaction``, ``too_many_ops``,
``too_many_keys``, ``duplicate_write``, ``too_many_slots``) and ``fields["index"]`` the op's index.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from queen_pg import text
from queen_pg.api.shared.body import INT32, INT64, has_nul
from queen_pg.api.shared.raw_fields import Prepared
from queen_pg.errors import KV_BAD_REQUEST, LOCKS_BAD_REQUEST, ErrorKind, QueenError

LOCKS_NS = "queen-locks"  # permits live here; written only through /api/v1/locks
# docs/wire.md#kv-namespaces: lowercase letters, digits, - _ . :, starting with a letter or digit (and MAX_NS_BYTES)
NAMESPACE_PATTERN = "^[a-z0-9][a-z0-9._:-]*$"
NAMESPACE_RE = re.compile(NAMESPACE_PATTERN)  # fullmatch: Python's `$` alone would let a final newline in
NAMESPACE_RULE = "lowercase letters, digits, '-', '_', '.' and ':', starting with a letter or digit"
# a lock name, an owner, a key: identifiers (docs/wire.md#text); a lock name also has no '#'
LOCK_NAME_PATTERN = text.pattern("#")
MAX_OPS = 64
MAX_KEYS = 256  # distinct (ns, key) pairs one call may touch
MAX_NS_BYTES = 128
MAX_KEY_BYTES = 1024
MAX_VALUE_BYTES = 1 << 20  # a value, as compact JSON
MAX_GET_MANY = 256
MAX_PREFIX_LIMIT = 1000
MAX_TTL_SECONDS = INT32  # ~68 years; longer is `forever`
MAX_VERSION = INT64
MAX_LOCK_NAME_BYTES = 256
MAX_OWNER_BYTES = 256
MAX_LOCK_LIMIT = 1024
MAX_LOCK_SLOTS = 1024  # sum of acquire limits in one call: each slot is an advisory lock until commit

WRITE_OPS = frozenset({"put", "putIfAbsent", "delete", "incr"})
_EXPIRY = frozenset({"ttlSeconds", "forever"})
_KV_FIELDS: dict[str, frozenset[str]] = {
    "get": frozenset({"op", "ns", "key"}),
    "getMany": frozenset({"op", "ns", "keys"}),
    "getPrefix": frozenset({"op", "ns", "prefix", "after", "limit", "keysOnly"}),
    "put": frozenset({"op", "ns", "key", "value", "expect", "required"}) | _EXPIRY,
    "putIfAbsent": frozenset({"op", "ns", "key", "value", "expect", "required"}) | _EXPIRY,
    "delete": frozenset({"op", "ns", "key", "expect", "required"}),
    "incr": frozenset({"op", "ns", "key", "delta", "min", "max", "required"}) | _EXPIRY,
    "check": frozenset({"op", "ns", "key", "expect", "required"}),
}
_LOCK_FIELDS: dict[str, frozenset[str]] = {
    "acquire": frozenset({"op", "name", "ttlSeconds", "owner", "limit"}),
    "renew": frozenset({"op", "name", "token", "ttlSeconds", "slot", "owner"}),
    "release": frozenset({"op", "name", "token", "slot"}),
    "get": frozenset({"op", "name"}),
}


_FROM_OP: Any = object()  # name(): read the field from the op


class _Checker:
    """Field checks for one op; every refusal names ``<label>[<index>].<field>``."""

    def __init__(self, kind: ErrorKind, label: str, index: int, op: dict[str, Any]) -> None:
        self.kind = kind
        self.where = f"{label}[{index}]"
        self.index = index
        self.op = op

    def fail(self, reason: str, field: str | None, message: str) -> QueenError:
        where = f"{self.where}.{field}" if field else self.where
        return QueenError(self.kind, detail=f"{where}: {message}", reason=reason, index=self.index, field=field)

    def fields(self, allowed: frozenset[str]) -> None:
        unknown = sorted(set(self.op) - allowed)
        if unknown:
            raise self.fail("unknown_field", unknown[0], f"unknown field for op {self.op['op']!r}")

    def name(self, field: str, limit: int, value: Any = _FROM_OP, *, no_hash: bool = False) -> str:
        v = self.op.get(field) if value is _FROM_OP else value
        if v is None:
            raise self.fail("missing_field", field, "is required")
        if not isinstance(v, str) or not v:
            raise self.fail("bad_field", field, "must be a non-empty string")
        if len(v.encode()) > limit:
            raise self.fail("too_long", field, f"is {len(v.encode())} bytes; the limit is {limit}")
        if text.has_control(v):
            raise self.fail("bad_field", field, text.MESSAGE)
        if no_hash and "#" in v:
            raise self.fail("bad_field", field, "must not contain '#' (it separates a lock's name from its slot)")
        return v

    def integer(self, field: str, lo: int, hi: int, *, required: bool = True) -> int | None:
        v = self.op.get(field)
        if v is None:
            if required:
                raise self.fail("missing_field", field, "is required")
            return None
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise self.fail("bad_field", field, f"must be an integer from {lo} to {hi}, got {v!r}")
        return v

    def number(self, field: str) -> int | float | None:
        v = self.op.get(field)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.fail("bad_field", field, f"must be a number (not a bool), got {v!r}")
        if isinstance(v, int) and not -(2**63) <= v < 2**64:
            raise self.fail("bad_field", field, "must be an integer within 64 bits (or a float)")
        return v

    def flag(self, field: str) -> bool:
        v = self.op.get(field, False)
        if not isinstance(v, bool):
            raise self.fail("bad_field", field, f"must be true or false, got {v!r}")
        return v

    def ttl(self) -> int:
        ttl = self.integer("ttlSeconds", 1, MAX_TTL_SECONDS)
        assert ttl is not None  # required=True
        return ttl


def _op_dict(kind: ErrorKind, label: str, index: int, raw: Any, known: dict[str, frozenset[str]]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise QueenError(kind, detail=f"{label}[{index}]: must be an object", reason="bad_field", index=index)
    op = raw.get("op")
    if op not in known:
        raise QueenError(
            kind,
            detail=f"{label}[{index}].op: must be one of {', '.join(known)}, got {op!r}",
            reason="unknown_op",
            index=index,
        )
    return raw


def _op_list(kind: ErrorKind, label: str, ops: object) -> list[Any]:
    if not isinstance(ops, list):
        raise QueenError(kind, detail=f"{label}: must be a list of operations", reason="bad_field")
    if len(ops) > MAX_OPS:
        raise QueenError(kind, detail=f"{label}: {len(ops)} operations; the limit is {MAX_OPS}", reason="too_many_ops")
    return ops


def _kv_op(c: _Checker, *, in_transaction: bool) -> dict[str, Any]:
    op: str = c.op["op"]
    c.fields(_KV_FIELDS[op])
    if op == "getPrefix" and in_transaction:
        raise c.fail("not_in_transaction", "op", "getPrefix is not allowed in a transaction")
    out: dict[str, Any] = {"op": op, "ns": c.name("ns", MAX_NS_BYTES)}
    if not NAMESPACE_RE.fullmatch(out["ns"]):
        raise c.fail(
            "bad_namespace", "ns", f"{out['ns']!r} is not a namespace: {NAMESPACE_RULE}, at most {MAX_NS_BYTES} bytes"
        )
    if op in WRITE_OPS and out["ns"] == LOCKS_NS:
        raise c.fail("reserved_namespace", "ns", f"{LOCKS_NS!r} is written only through /api/v1/locks")

    if op == "getMany":
        keys = c.op.get("keys")
        if not isinstance(keys, list) or not keys:
            raise c.fail("bad_field" if "keys" in c.op else "missing_field", "keys", "must be a non-empty list")
        if len(keys) > MAX_GET_MANY:
            raise c.fail("too_many_keys", "keys", f"{len(keys)} keys; the limit is {MAX_GET_MANY}")
        out["keys"] = list(dict.fromkeys(c.name("keys", MAX_KEY_BYTES, k) for k in keys))
        return out
    if op == "getPrefix":
        out["prefix"] = c.name("prefix", MAX_KEY_BYTES)
        if "after" in c.op:
            out["after"] = c.name("after", MAX_KEY_BYTES)
        limit = c.op.get("limit")
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int):
                raise c.fail("bad_field", "limit", f"must be an integer, got {limit!r}")
            out["limit"] = min(max(limit, 1), MAX_PREFIX_LIMIT)  # clamped, never refused (docs/wire.md#kv)
        if c.flag("keysOnly"):
            out["keysOnly"] = True
        return out

    out["key"] = c.name("key", MAX_KEY_BYTES)
    if op in ("put", "putIfAbsent"):
        if "value" not in c.op:
            raise c.fail("missing_field", "value", "is required (null is a value)")
        value = c.op["value"]
        try:
            encoded = orjson.dumps(value)
        except orjson.JSONEncodeError as err:
            # a big body's value (api/shared/raw_fields.py): checked already, stored as its bytes
            if not isinstance(value, Prepared) or value.encoded is None:
                said = value.failure if isinstance(value, Prepared) else str(err)
                raise c.fail(
                    "bad_field", "value", f"cannot be stored exactly ({said}): integers must fit in 64 bits"
                ) from None
            encoded = value.encoded
            value = orjson.Fragment(encoded)
        if len(encoded) > MAX_VALUE_BYTES:
            raise c.fail("too_large", "value", f"is {len(encoded)} bytes as JSON; the limit is {MAX_VALUE_BYTES}")
        if has_nul(encoded):
            raise c.fail("bad_field", "value", "must not contain the character U+0000 (PostgreSQL jsonb refuses it)")
        out["value"] = value
    if op in ("put", "putIfAbsent", "incr"):
        declared = sorted(_EXPIRY & set(c.op))
        if len(declared) != 1:
            raise c.fail("bad_field", "ttlSeconds", "exactly one of ttlSeconds (an integer > 0) or forever: true")
        if declared == ["forever"]:
            if c.op["forever"] is not True:
                raise c.fail("bad_field", "forever", "must be true when given")
            out["forever"] = True
        else:
            out["ttlSeconds"] = c.ttl()
    if "expect" in c.op:
        out["expect"] = c.integer("expect", 0, MAX_VERSION)
        if op == "putIfAbsent" and out["expect"] != 0:
            raise c.fail("bad_field", "expect", "putIfAbsent means expect 0; use put with expect for a version")
    elif op == "check":
        raise c.fail("missing_field", "expect", "is required: the version the key must be at, or 0 for absent")
    if op == "incr":
        delta, lo, hi = c.number("delta"), c.number("min"), c.number("max")
        out["delta"] = 1 if delta is None else delta
        if lo is not None:
            out["min"] = lo
        if hi is not None:
            out["max"] = hi
        if lo is not None and hi is not None and lo > hi:
            raise c.fail("bad_field", "min", f"min {lo} is above max {hi}")
    if c.flag("required"):
        out["required"] = True
    return out


def validate_kv_ops(ops: object, *, in_transaction: bool) -> list[dict[str, Any]]:
    """The normalized ops, or ``QueenError(KV_BAD_REQUEST)`` naming the first bad op and field.

    Limits per call: ``MAX_OPS`` ops, ``MAX_KEYS`` distinct (ns, key) pairs, one write per pair.
    ``in_transaction`` refuses ``getPrefix`` and labels ops ``kv[i]`` (else ``operations[i]``)."""
    label = "kv" if in_transaction else "operations"
    out: list[dict[str, Any]] = []
    keys: set[tuple[str, str]] = set()
    written: dict[tuple[str, str], int] = {}
    for index, raw in enumerate(_op_list(KV_BAD_REQUEST, label, ops)):
        c = _Checker(KV_BAD_REQUEST, label, index, _op_dict(KV_BAD_REQUEST, label, index, raw, _KV_FIELDS))
        op = _kv_op(c, in_transaction=in_transaction)
        pairs = [(op["ns"], k) for k in op.get("keys", [op.get("key")]) if k is not None]
        keys.update(pairs)
        if len(keys) > MAX_KEYS:
            raise c.fail("too_many_keys", None, f"the call touches more than {MAX_KEYS} distinct keys")
        if op["op"] in WRITE_OPS:
            pair = pairs[0]
            if pair in written:
                raise c.fail(
                    "duplicate_write",
                    "key",
                    f"{label}[{written[pair]}] already writes {pair[0]}/{pair[1]}; one write per key per call",
                )
            written[pair] = index
        out.append(op)
    return out


def validate_lock_ops(ops: object) -> list[dict[str, Any]]:
    """The normalized lock ops, or ``QueenError(LOCKS_BAD_REQUEST)`` naming the op and field.

    Names follow the client's rule (1..256 bytes, no '#', no control characters); ``ttlSeconds`` is
    an integer > 0 (no forever); ``limit`` 1..1024 and, summed over the call's acquires, ≤ 1024."""
    label = "operations"
    out: list[dict[str, Any]] = []
    slots = 0
    for index, raw in enumerate(_op_list(LOCKS_BAD_REQUEST, label, ops)):
        c = _Checker(LOCKS_BAD_REQUEST, label, index, _op_dict(LOCKS_BAD_REQUEST, label, index, raw, _LOCK_FIELDS))
        kind: str = c.op["op"]
        c.fields(_LOCK_FIELDS[kind])
        op: dict[str, Any] = {"op": kind, "name": c.name("name", MAX_LOCK_NAME_BYTES, no_hash=True)}
        if kind in ("renew", "release"):
            op["token"] = c.integer("token", 1, MAX_VERSION)
            slot = c.integer("slot", 0, MAX_LOCK_LIMIT - 1, required=False)
            if slot is not None:
                op["slot"] = slot
        if kind in ("acquire", "renew"):
            op["ttlSeconds"] = c.ttl()
            if c.op.get("owner") is not None:
                op["owner"] = c.name("owner", MAX_OWNER_BYTES)
        if kind == "acquire":
            op["limit"] = c.integer("limit", 1, MAX_LOCK_LIMIT, required=False) or 1
            slots += op["limit"]
            if slots > MAX_LOCK_SLOTS:
                raise c.fail(
                    "too_many_slots", "limit", f"the acquires of one call span more than {MAX_LOCK_SLOTS} slots"
                )
        out.append(op)
    return out
