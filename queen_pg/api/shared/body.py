"""Request bodies: one declarative definition (a ``msgspec.Struct``) per body that both validates and
documents.

A route declares its body as a Struct beside it (constraints as ``msgspec.Meta``: lengths, patterns,
ranges), reads it with :func:`read` (a cached ``msgspec.json.Decoder`` per type: one pass over the
bytes, no per-item model objects) and documents it with ``docs.body(Struct)``, which puts the same
Struct's JSON Schema (``msgspec.json.schema_components``) into ``/openapi.json``. What a schema cannot
say (a byte limit, "exactly one of", one write per key) stays a check in the route, and the schema's
description says it; the schema never claims valid what the route refuses by a rule it could express.

Numbers: msgspec decodes integers of any size exactly and refuses ``1e999``; JSON that is stored
(payloads, KV values, trace data, unknown queue options) goes through :func:`stored_json`, which
refuses what could not come back exactly (integers beyond 64 bits, nesting past 254 levels, lone
surrogates) and what PostgreSQL cannot hold (U+0000).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from types import UnionType
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import msgspec
import orjson
from fastapi import Request

from queen_pg import text
from queen_pg.api.shared import item_limit, raw_fields
from queen_pg.errors import BAD_JSON, BAD_REQUEST, ErrorKind, QueenError

T = TypeVar("T")

MAX_NAME = 255  # bytes of UTF-8; also checked by check_name (413 name_too_long)
MAX_TXN_BYTES = 65_535  # a QPF1 frame stores the transactionId length in a u16
INT32 = 2**31 - 1
INT64 = 2**63 - 1

NAME_DOC = f"1-{MAX_NAME} bytes of UTF-8 (413 `name_too_long` above), {text.RULE}"
# The byte limit is check_name's (413 name_too_long, as for names in paths and query strings); the
# schema states it as maxLength (characters, which JSON Schema counts).
Name = Annotated[
    str,
    msgspec.Meta(min_length=1, pattern=text.PATTERN, description=NAME_DOC, extra_json_schema={"maxLength": MAX_NAME}),
]
# The text rules are queen_pg/text.py's (docs/wire.md#text): identifiers hold no control character,
# free text no U+0000.
Text = Annotated[str, msgspec.Meta(pattern=text.FREE_TEXT_PATTERN, description="free text without U+0000")]
LeaseId = Annotated[str, msgspec.Meta(min_length=1, pattern=text.PATTERN, description=f"a lease id, {text.RULE}")]
NewTxnId = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_TXN_BYTES,
        pattern=text.PATTERN,
        description=f"1-{MAX_TXN_BYTES} bytes of UTF-8, {text.RULE}; minted when absent",
    ),
]
TxnId = Annotated[
    str, msgspec.Meta(min_length=1, pattern=text.PATTERN, description="a transactionId as a pop delivered it")
]


def identifier(max_bytes: int, description: str, *, pattern: str = text.PATTERN, also: str = "") -> msgspec.Meta:
    """The constraints of a string field that holds an identifier of 1-``max_bytes`` bytes of UTF-8
    (docs/wire.md#text), for ``Annotated[str, identifier(...)]``. Decoding checks ``pattern`` and at most
    ``max_bytes`` characters (a string within the bytes is within as many characters); the byte limit is
    the validator's that owns the field. ``also``: a stricter pattern that validator decides (with its own
    answer): stated in the schema (``allOf``), not checked by the decoder."""
    return msgspec.Meta(
        min_length=1,
        max_length=max_bytes,
        pattern=pattern,
        description=description,
        extra_json_schema={"allOf": [{"pattern": also}]} if also else None,
    )


PartitionId = Annotated[
    Annotated[str, msgspec.Meta(pattern=r"^[1-9][0-9]{0,17}$")] | Annotated[int, msgspec.Meta(ge=1, le=INT64)],
    msgspec.Meta(description="the partition's numeric id as a pop returned it (a string or an integer)"),
]


@cache
def decoder(t: Any, strict: bool = True) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(t, strict=strict)


# The fast path. The text rules' patterns (no control character, no NUL) cost a Python regex per
# string: 3 of them per ack item are ~2.6 µs, more than the rest of its decoding. They can only fail
# on a string holding a control character, and JSON can only carry one escaped (msgspec refuses raw
# C0 bytes), as a raw DEL byte or as a raw C1 character (UTF-8 0xC2 0x80-0x9F). A body in which
# _clean finds none of those is decoded as a twin of its type without those patterns (every
# other constraint kept): it cannot decide differently. Any other body, and any refusal, goes through
# the declared type, so every answer, error text included, is the declared type's. The Structs keep
# documenting the rules.
_SCANNED = frozenset({text.PATTERN, text.FREE_TEXT_PATTERN})
# Each regex starts with a literal byte, which `re` looks for at C speed; one regex of the three
# alternatives would try every position (~1 µs per 100 bytes).
_ESCAPED_CONTROL = re.compile(rb"\\(?:[bfnrt]|u00[0189]|u007[fF])")
_RAW_C1 = re.compile(rb"\xc2[\x80-\x9f]")
# Patterns the twin checks with a narrower type instead of a Python regex per string (``narrow``).
_NARROWER: dict[str, Any] = {}


def narrow(pattern: str, narrower: Any) -> None:
    """Let the twin (below) check a field of ``pattern`` as ``narrower`` (say a ``Literal`` of the usual
    spellings, which msgspec checks without a regex). ``narrower`` must accept only strings the pattern
    accepts: a body it refuses is decoded again as the declared type, which decides and words the answer."""
    _NARROWER[pattern] = narrower
    _twin.cache_clear()
    decoder.cache_clear()


def _clean(raw: bytes) -> bool:
    """No escaped control character, no raw DEL and no raw C1 in ``raw``. Three memchr scans first: a
    body without a backslash, a DEL byte or a 0xC2 byte (the usual one) needs no regex at all."""
    if b"\x7f" in raw:
        return False
    if b"\\" in raw and _ESCAPED_CONTROL.search(raw) is not None:
        return False
    return b"\xc2" not in raw or _RAW_C1.search(raw) is None


_META_FIELDS = ("gt", "ge", "lt", "le", "multiple_of", "pattern", "max_length", "min_length", "tz", "title",
                "description", "examples", "extra_json_schema", "extra")  # fmt: skip


@cache
def _twin(t: Any) -> Any:
    """``t`` with the scanned patterns dropped: a Struct becomes a subclass of itself (isinstance,
    attributes, tags and encode names unchanged); containers and unions are rebuilt around twins."""
    origin, args = get_origin(t), get_args(t)
    if origin is Annotated:
        inner, *metas = args
        for m in metas:
            if isinstance(m, msgspec.Meta) and m.pattern in _NARROWER:
                return _NARROWER[m.pattern]
        kept = []
        for m in metas:
            if isinstance(m, msgspec.Meta) and m.pattern in _SCANNED:
                kw = {k: getattr(m, k) for k in _META_FIELDS if getattr(m, k) is not None and k != "pattern"}
                m = msgspec.Meta(**kw)
            kept.append(m)
        return Annotated[(_twin(inner), *kept)] if kept else _twin(inner)
    if isinstance(t, type) and issubclass(t, msgspec.Struct):
        fields = []
        for f in msgspec.structs.fields(t):
            fields.append((f.name, _twin(f.type), raw_fields.field_spec(f)))
        c = t.__struct_config__
        return msgspec.defstruct(t.__name__, fields, bases=(t,), module=t.__module__, tag=c.tag,
                                 tag_field=c.tag_field, forbid_unknown_fields=c.forbid_unknown_fields)  # fmt: skip
    if origin in (Union, UnionType):
        return Union[tuple(_twin(a) for a in args)]  # noqa: UP007 (rebuilt from a tuple)
    if origin in (list, tuple, dict, set, frozenset) and args:
        return origin[tuple(_twin(a) for a in args)]
    return t


def _decode(raw: bytes, t: Any) -> Any:
    """Strict decoding, except that a number with an integral value (``5.0``) is an integer, as JSON
    Schema says: only then is the body decoded again with msgspec's lax rules. Through the twin type
    (above) when the body cannot hold a character the scanned patterns refuse. A body of
    ``raw_fields.BIG_BODY`` bytes or more whose type has free-form fields is read as its raw variant:
    those fields become ``raw_fields.Prepared`` (api/shared/raw_fields.py), with the same refusals."""
    if len(raw) >= raw_fields.BIG_BODY:
        rt = raw_fields.variant(t)
        if rt is not t:
            value = _decode_as(raw, rt)
            raw_fields.prepare_all(value)
            return value
    return _decode_as(raw, t)


def _decode_as(raw: bytes, t: Any) -> Any:
    if _clean(raw):
        try:
            return decoder(_twin(t)).decode(raw)
        except msgspec.MsgspecError:
            pass  # decided (and worded) by the declared type below
    try:
        return decoder(t).decode(raw)
    except msgspec.ValidationError as err:
        said = str(err)
        if "Expected `int" not in said or "got `float`" not in said:
            raise
        return decoder(t, False).decode(raw)


def where(err: msgspec.ValidationError) -> tuple[str, str]:
    """(path, message) of a msgspec error: ``Expected `int` - at `$.items[0].n``` ->
    (``items[0].n``, ``Expected `int```); the path is ``body`` for the top level."""
    said = str(err)
    message, sep, at = said.rpartition(" - at `")
    if not sep:
        return "body", _WORDS.get(said, said)
    path = at.rstrip("`").removeprefix("$").lstrip(".")
    return path or "body", _WORDS.get(message, message)


# A text rule's refusal in its own words, not as msgspec's regex.
_WORDS = {
    f"Expected `str` matching regex {text.PATTERN!r}": text.MESSAGE,
    f"Expected `str` matching regex {text.FREE_TEXT_PATTERN!r}": text.FREE_TEXT_MESSAGE,
}


# msgspec decodes nested arrays and objects by recursion: a body nesting deeper than the interpreter's
# recursion limit (about 1000 levels, fewer under the ASGI stack) raises RecursionError, not a
# DecodeError. RFC 8259 lets a parser limit nesting; nothing deeper than 254 levels can be stored anyway.
TOO_DEEP = "JSON nests too deeply to be read (a stored value may nest at most 254 levels)"


def decode(raw: bytes, t: type[T], *, kind: ErrorKind = BAD_REQUEST, **fields: Any) -> T:
    """``raw`` as ``t``; malformed JSON is 400 ``bad_json``, a wrong shape 400 of ``kind`` naming the field."""
    try:
        value: T = _decode(raw, t)
    except RecursionError:
        raise QueenError(kind, detail=f"body: {TOO_DEEP}", **fields) from None
    except msgspec.ValidationError as err:
        path, message = where(err)
        raise QueenError(kind, detail=f"{path}: {message}", **fields) from None
    except msgspec.DecodeError as err:
        if kind is BAD_REQUEST:
            raise QueenError(BAD_JSON, detail=str(err)) from None
        raise QueenError(kind, detail=f"request body is not valid JSON: {err}", **fields) from None
    return value


async def read(
    request: Request, t: type[T], *, empty_ok: bool = False, before: Callable[[bytes], None] | None = None
) -> T:
    """The request body as ``t`` (an empty body reads as ``{}`` when ``empty_ok``, else a 400).
    ``before``: a check of the raw body before it is decoded (the item count, api/shared/item_limit.py)."""
    raw = await request.body()
    if not raw.strip():
        if not empty_ok:
            raise QueenError(BAD_REQUEST, detail="request body is empty; a JSON object is required")
        raw = b"{}"
    if before is not None:
        before(raw)
    return decode(raw, t)


# U+0000 as orjson writes it, not preceded by an escaping backslash (`\\u0000` is the text "\u0000").
_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def stored_json(value: Any, what: str, *, nul_ok: bool = False) -> bytes:
    """``value`` (or a big body's ``raw_fields.Prepared``) as the JSON bytes to store, or 400: a value
    either comes back exactly or is refused. ``nul_ok``: the caller stores text that jsonb refuses some
    other way (trace data)."""
    try:
        encoded = orjson.dumps(value)
    except orjson.JSONEncodeError as err:
        said = str(err)
        if isinstance(value, raw_fields.Prepared):
            if value.encoded is not None:
                return stored_json_checked(value.encoded, what, nul_ok=nul_ok)
            said = value.failure
        raise QueenError(
            BAD_REQUEST,
            detail=f"{what} cannot be stored exactly ({said}): integers must fit in 64 bits, nesting in 254 levels",
        ) from None
    return stored_json_checked(encoded, what, nul_ok=nul_ok)


def stored_json_checked(encoded: bytes, what: str, *, nul_ok: bool) -> bytes:
    """``encoded`` (JSON that comes back exactly), unless it holds U+0000 where that is refused."""
    if not nul_ok and has_nul(encoded):
        raise QueenError(BAD_REQUEST, detail=f"{what} must not contain the character U+0000 (PostgreSQL refuses it)")
    return encoded


def has_nul(encoded: bytes) -> bool:
    """Whether JSON text (as orjson writes it) holds U+0000 in a string or key."""
    return b"\\u0000" in encoded and _NUL.search(encoded) is not None


def decode_family(raw: bytes, t: type[T], kind: ErrorKind, *, owned: Callable[[str], bool] | None = None) -> T:
    """``raw`` as ``t`` for the KV, locks and timers families: a refusal carries ``reason`` (a stable
    id: ``bad_json``, ``bad_body``, ``missing_field``, ``unknown_field``, ``unknown_op``, ``too_long``,
    ``too_many_ops``, ``too_many_keys``, ``server_owned``, ``bad_field``) and names the op and field."""
    if not raw.strip():
        raise QueenError(kind, detail='request body is empty; expected {"operations": [...]}', reason="bad_body")
    shape: Any = t  # a Struct class: hashable, as the cache needs
    for name, most in _capped_lists(shape):
        # msgspec would build the whole list before refusing its length: counted first, same answer
        if item_limit.over(raw, (name,), most):
            message = f"Expected `array` of length <= {most}"
            raise QueenError(kind, detail=f"{name}: {message}", reason="too_many_ops")
    try:
        value: T = _decode(raw, t)
    except RecursionError:
        raise QueenError(kind, detail=f"body: {TOO_DEEP}", reason="bad_body") from None
    except msgspec.ValidationError as err:
        path, message = where(err)
        field = _FIELD.search(message)
        reason = "bad_field"
        if path == "body":
            reason = "bad_body"
        elif message.startswith("Object missing required field"):
            reason = "missing_field"
        elif message.startswith("Object contains unknown field"):
            reason = "server_owned" if owned is not None and field and owned(field.group(1)) else "unknown_field"
        elif message.startswith("Invalid value") and path.endswith(".op"):
            reason = "unknown_op"
        elif "`array` of length <=" in message:
            reason = "too_many_keys" if path.endswith(".keys") else "too_many_ops"
        elif "`str` of length <=" in message:
            reason = "too_long"
        if field and reason in ("missing_field", "unknown_field", "server_owned"):
            path = f"{path}.{field.group(1)}"
        raise QueenError(kind, detail=f"{path}: {message}", reason=reason) from None
    except msgspec.DecodeError as err:
        raise QueenError(kind, detail=f"request body is not valid JSON: {err}", reason="bad_json") from None
    return value


_FIELD = re.compile(r"field `([^`]*)`")


@cache
def _capped_lists(t: Any) -> tuple[tuple[str, int], ...]:
    """(encoded name, max_length) of each field of the Struct ``t`` that is a list with a declared
    ``max_length`` (the ops of /kv, /locks, /timers). Counted early only when its elements are objects
    (item_limit.over counts ``{``); any other list is left to msgspec, which answers the same."""
    if not (isinstance(t, type) and issubclass(t, msgspec.Struct)):
        return ()
    out: list[tuple[str, int]] = []
    for f in msgspec.structs.fields(t):
        if get_origin(f.type) is not Annotated:
            continue
        inner, *metas = get_args(f.type)
        most = [m.max_length for m in metas if isinstance(m, msgspec.Meta) and m.max_length is not None]
        if most and get_origin(inner) is list:
            out.append((f.encode_name, most[0]))
    return tuple(out)
