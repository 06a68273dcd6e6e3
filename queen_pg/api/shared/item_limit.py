"""How many items a request body carries, counted before any item is built (``QUEEN_MAX_ITEMS``,
docs/wire.md#errors: 413 ``too_many_items``, nothing written).

A request's items cost memory at every step after decoding (the engine's columns, frames, hashes,
ids, one result each): a 5 MB push of 200,000 tiny items took a worker past 1 GB. So the count is
known before the body is decoded into items, and a request over the limit is refused there.

msgspec checks a list's ``max_length`` only after it has built the whole list. What it does refuse
at once is an array-like Struct's extra element when the Struct forbids unknown fields: an
:func:`_at_most` Struct of ``n`` optional fields decodes an array of at most ``n`` elements, each a
``msgspec.Raw`` (a view of the body, no copy), and stops at element ``n + 1``. Counting is then one
pass over the body at skipping speed, holding at most ``n`` views.

Items are JSON objects, each opening with its own ``{``: a body with no more ``{`` bytes than the
limit cannot carry more items than it (a memchr count, ~1 µs per 10 KiB), and is not counted
further. That is every usual body; a body with more braces (payloads holding objects) is counted.

A body that is not what the count expects (not an object, ``items`` not an array, malformed JSON) is
left to the route's decoder, which words the refusal.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import msgspec

from queen_pg.errors import TOO_MANY_ITEMS, QueenError

_SMALL = 64  # tried first: most arrays a transaction's push op holds are short


@cache
def _at_most(n: int) -> type[msgspec.Struct]:
    """An array of at most ``n`` JSON values, as a Struct whose fields fill in order (the rest UNSET)."""
    fields = [(f"v{k}", msgspec.Raw, msgspec.UNSET) for k in range(n)]
    return msgspec.defstruct(f"AtMost{n}", fields, array_like=True, forbid_unknown_fields=True)


@cache
def _array(n: int) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(_at_most(n))


@cache
def _fields(keys: tuple[str, ...], n: int) -> msgspec.json.Decoder[Any]:
    """An object whose ``keys`` (when present and arrays) are counted up to ``n``; other keys skipped."""
    t = _at_most(n) | None
    return msgspec.json.Decoder(msgspec.defstruct("Counted", [(k, t, None) for k in keys]))


class _Op(msgspec.Struct):
    """What the count reads of a transaction's operation: its tag, and a push's items (as views). A tag
    spelled with escapes counts as one item here; the route counts the decoded body again."""

    type: msgspec.Raw = msgspec.Raw()
    items: msgspec.Raw = msgspec.Raw()


_op = msgspec.json.Decoder(_Op)
_PUSH = b'"push"'


def _filled(value: msgspec.Struct | None) -> int:
    """How many elements an :func:`_at_most` Struct received (they fill its fields in order)."""
    if value is None:
        return 0
    t = msgspec.structs.astuple(value)
    lo, hi = 0, len(t)  # the first UNSET, by bisection
    unset = msgspec.UNSET
    while lo < hi:
        mid = (lo + hi) // 2
        if t[mid] is unset:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _over(err: msgspec.ValidationError) -> bool:
    return "of at most length" in str(err)


def too_many(what: str, limit: int, got: int | None = None) -> QueenError:
    """413 ``too_many_items``: ``what`` holds ``got`` items (None: counted no further than ``limit`` + 1)."""
    held = f"more than {limit}" if got is None else str(got)
    return QueenError(TOO_MANY_ITEMS, detail=f"{what} holds {held}", limit=limit)


def length(raw: msgspec.Raw | bytes, limit: int) -> int | None:
    """The elements of the JSON array ``raw``; None when there are more than ``limit`` (counted up to
    ``limit`` + 1). Raises msgspec's error when ``raw`` is no array."""
    for n in (_SMALL, limit) if limit > _SMALL else (limit,):
        try:
            return _filled(_array(n).decode(raw))
        except msgspec.ValidationError as err:
            if not _over(err):
                raise
    return None


def over(raw: bytes, keys: tuple[str, ...], limit: int) -> bool:
    """Whether the arrays under the top-level ``keys`` of the JSON object ``raw`` hold more than
    ``limit`` elements together (of objects, as items are); False too when ``raw`` is not what the
    count expects (the route's decoder words that)."""
    if raw.count(b"{") <= limit:
        return False
    try:
        counted = _fields(keys, limit).decode(raw)
    except msgspec.ValidationError as err:
        return _over(err)
    except (msgspec.DecodeError, RecursionError):
        return False
    return sum(_filled(getattr(counted, k)) for k in keys) > limit


def check_lists(raw: bytes, keys: tuple[str, ...], limit: int) -> None:
    """413 ``too_many_items`` when the arrays under the top-level ``keys`` of the JSON object ``raw``
    hold more than ``limit`` elements together; anything else is the route decoder's to word."""
    if over(raw, keys, limit):
        raise too_many(" and ".join(keys), limit)


_TX_KEYS = ("operations", "kv", "timers")
TRANSACTION = "the transaction (its acks, pushed messages, kv and timers operations)"


def check_transaction(raw: bytes, limit: int) -> None:
    """:func:`check_lists` for a transaction body: each ack operation is an item, each push operation
    as many as its ``items``, and each ``kv`` and ``timers`` operation one."""
    if raw.count(b"{") <= limit:
        return
    what = TRANSACTION
    try:
        counted = _fields(_TX_KEYS, limit).decode(raw)
    except msgspec.ValidationError as err:
        if _over(err):
            raise too_many(what, limit) from None
        return
    except (msgspec.DecodeError, RecursionError):
        return
    total = _filled(counted.kv) + _filled(counted.timers)
    ops = counted.operations
    if ops is None:
        return
    for k in range(_filled(ops)):
        try:
            op = _op.decode(getattr(ops, f"v{k}"))
        except msgspec.MsgspecError:
            return  # not an object: the route's decoder words it
        if len(op.type) != len(_PUSH) or bytes(op.type) != _PUSH or not len(op.items):
            total += 1
            continue
        try:
            n = length(op.items, limit)
        except msgspec.MsgspecError:
            return
        if n is None or total + n > limit:
            raise too_many(what, limit)
        total += n
    if total > limit:
        raise too_many(what, limit)
