"""Free-form JSON fields of a big body, read without building them (docs/wire.md#limits-and-bad-input).

A body's free-form fields (a pushed item's ``payload``/``data``, a KV ``value``, a trace's ``data``:
the Struct fields typed ``Any``) decode to Python objects: 25-30 times their size for ``[{},{},...]``
(a 16 MiB push took 388 MiB). A body of :data:`BIG_BODY` bytes or more is decoded instead as the
*raw variant* of its type (:func:`variant`: those fields as ``msgspec.Raw``, views of the body), then
:func:`prepare_all` turns each such field, in order, into a :class:`Prepared`: the JSON bytes to store.

- A field under ``json_check.SMALL`` bytes is decoded and written back exactly as a small body's is
  (``orjson.dumps``): the same bytes, the same refusals; its objects are freed before the next field.
- A bigger one is checked by ``json_check`` (the same rules, without objects) and kept as sent without
  its whitespace (``msgspec.json.format``): ``1E2`` stays ``1E2``, ``"\\u00e9"`` stays escaped.

The refusals are those of a small body, in its words: what decoding refuses (a number that reads as
an infinite double, bad UTF-8) is raised here as msgspec's error at the same path (``body.decode``
words it), and what writing back refuses (an integer beyond 64 bits, nesting past 254 levels) is kept
in :attr:`Prepared.failure` for the route to word as it does today, when it reaches that field. A body
smaller than :data:`BIG_BODY` is decoded as before: its objects are at most ~30 MiB (30 x 1 MiB),
freed when answered, and the hot path's small pushes pay nothing more. Known difference: a body with
two errors may name another one first (the fields are checked after the rest of the body is read).
"""

from __future__ import annotations

import math
import re
from functools import cache
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import msgspec
import orjson

from queen_pg.engine import json_check

BIG_BODY = 1 << 20  # bodies from this size on are read as their raw variant
SMALL = json_check.SMALL  # a field from this size on is checked without being built


class Prepared:
    """A free-form field ready to store: ``encoded`` (compact JSON), or None and ``failure``: why it
    cannot be stored exactly (orjson's words: "Integer exceeds 64-bit range", "Recursion limit reached").
    Not a type orjson writes: ``orjson.dumps`` of one raises, so a caller that writes a small body's
    decoded field takes it in its ``except`` branch and the usual path tests nothing more."""

    __slots__ = ("encoded", "failure")

    def __init__(self, encoded: bytes | None, failure: str = "") -> None:
        self.encoded = encoded
        self.failure = failure


def _free_form(t: Any) -> bool:
    if t is Any:
        return True
    return get_origin(t) is Annotated and get_args(t)[0] is Any


def field_spec(f: msgspec.structs.FieldInfo) -> Any:
    """The ``msgspec.field`` that declares ``f`` again (its default and wire name) in a derived Struct."""
    if f.default is not msgspec.NODEFAULT:
        return msgspec.field(default=f.default, name=f.encode_name)
    if f.default_factory is not msgspec.NODEFAULT:
        return msgspec.field(default_factory=f.default_factory, name=f.encode_name)
    return msgspec.field(name=f.encode_name)


@cache
def variant(t: Any) -> Any:
    """``t`` with every Struct field typed ``Any`` read as ``msgspec.Raw`` (``t`` itself when it has
    none). A Struct becomes a subclass of itself (isinstance, tags and names unchanged)."""
    origin, args = get_origin(t), get_args(t)
    if origin is Annotated:
        inner, *metas = args
        v = variant(inner)
        return t if v is inner else Annotated[(v, *metas)]
    if isinstance(t, type) and issubclass(t, msgspec.Struct):
        fields, changed = [], False
        for f in msgspec.structs.fields(t):
            ft = msgspec.Raw if _free_form(f.type) else variant(f.type)
            changed = changed or ft is not f.type
            fields.append((f.name, ft, field_spec(f)))
        if not changed:
            return t
        c = t.__struct_config__
        return msgspec.defstruct(t.__name__, fields, bases=(t,), module=t.__module__, tag=c.tag,
                                 tag_field=c.tag_field, forbid_unknown_fields=c.forbid_unknown_fields)  # fmt: skip
    if origin in (Union, UnionType):
        vs = tuple(variant(a) for a in args)
        return t if vs == args else Union[vs]  # noqa: UP007 (rebuilt from a tuple)
    if origin is dict and len(args) == 2 and _free_form(args[1]):
        return dict.__class_getitem__((args[0], msgspec.Raw))
    if origin in (list, tuple, dict, set, frozenset) and args:
        vs = tuple(variant(a) for a in args)
        return t if vs == args else origin[vs]
    return t


_FIELDS: dict[type, tuple[tuple[str, str], ...]] = {}
_NESTED = (msgspec.Struct, list, dict)


def prepare_all(value: Any, path: str = "$") -> None:
    """Replace, in place and in order, every ``msgspec.Raw`` field of the decoded Structs in ``value``
    by its :class:`Prepared`; raises what decoding the field would have raised (module doc)."""
    if isinstance(value, msgspec.Struct):
        cls = type(value)
        fields = _FIELDS.get(cls)
        if fields is None:
            fields = _FIELDS[cls] = tuple(
                (f.name, f.encode_name) for f in msgspec.structs.fields(cls) if _may_hold(f.type)
            )
            PREPARED.add(cls)
        for name, encoded in fields:
            v = getattr(value, name)
            if type(v) is msgspec.Raw:
                setattr(value, name, prepare(v, f"{path}.{encoded}"))
            elif isinstance(v, _NESTED):
                prepare_all(v, f"{path}.{encoded}")
    elif isinstance(value, dict):
        for k, v in value.items():
            if type(v) is msgspec.Raw:
                value[k] = prepare(v, f"{path}[...]")  # msgspec's path for a key
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if not isinstance(v, _NESTED):
                return  # a list of scalars (names, keys)
            prepare_all(v, f"{path}[{i}]")


def _may_hold(t: Any) -> bool:
    """Whether a field of type ``t`` may hold a ``msgspec.Raw`` (not a name, a number, a flag)."""
    if t is msgspec.Raw or t is Any:
        return True
    origin = get_origin(t)
    if origin is Annotated:
        return _may_hold(get_args(t)[0])
    if origin in (Union, UnionType):
        return any(_may_hold(a) for a in get_args(t))
    return origin in (list, tuple, dict) or (isinstance(t, type) and issubclass(t, msgspec.Struct))


def dumps(value: Any) -> bytes:
    """``orjson.dumps`` for the fields of a raw variant: a :class:`Prepared` is its bytes (or the
    JSONEncodeError writing it back raised), anything else (a default: None) is written as usual."""
    if type(value) is Prepared:
        if value.encoded is None:
            raise orjson.JSONEncodeError(value.failure)
        return value.encoded
    return orjson.dumps(value)


# The Struct classes prepare_all has walked (raw variants and their twins): ``type(x) in PREPARED`` says
# an instance holds Prepared fields, at the cost of a set lookup (a missing attribute would raise inside).
PREPARED: set[type] = set()


def prepare(raw: msgspec.Raw, path: str) -> Prepared:
    """One field (``path``: where msgspec would say it is, ``$.items[0].payload``)."""
    if len(raw) < SMALL:
        try:
            value = msgspec.json.decode(raw)
        except msgspec.ValidationError as err:  # "Number out of range - at `$[0]`": at the field's path
            message, sep, at = str(err).rpartition(" - at `$")
            if not sep:  # the field itself
                message, at = str(err), "`"
            raise msgspec.ValidationError(f"{message} - at `{path}{at}") from None
        try:
            return Prepared(orjson.dumps(value))
        except orjson.JSONEncodeError as err:
            return Prepared(None, str(err))
    data = bytes(raw)  # one copy of the field, freed once stored
    rule = json_check.refusal(data)
    if rule == json_check.UTF8:
        raise msgspec.DecodeError("Invalid UTF-8 encoded string")
    if rule == json_check.INFINITE:
        raise msgspec.ValidationError(f"Number out of range - at `{path}{_infinite_at(data)}`")
    if rule == json_check.INTEGER:
        return Prepared(None, "Integer exceeds 64-bit range")
    if rule == json_check.DEPTH:
        return Prepared(None, "Recursion limit reached")
    if rule is not None:  # syntax: read already by the body's decoding, so not expected
        raise msgspec.DecodeError(rule)
    return Prepared(msgspec.json.format(data, indent=-1))


_CANDIDATE = re.compile(rb"-?\d+(?:\.\d+)?[eE]\+?\d{3,}|-?\d{200,}(?:\.\d+)?(?:[eE][+\-]?\d+)?")
_OPEN = re.compile(rb"[\[{]")
_INNERMOST = re.compile(rb"\[[^\[\]{}]*\]|\{[^\[\]{}]*\}")


def _infinite_at(payload: bytes) -> str:
    """msgspec's path (``[3][...][0]``: an index per array, ``[...]`` per object) of the first number of
    ``payload`` that reads as an infinite double ("" when none is found). Only on a refusal: a copy
    without the strings (the path needs only brackets and commas), then the containers around it."""
    bare = json_check.without_strings(payload)
    for m in _CANDIDATE.finditer(bare):
        if math.isinf(float(m.group())):
            prefix = bytes(bare[: m.start()])
            break
    else:
        return ""
    while True:  # drop closed containers, innermost first: what is left opens the number's ancestors
        shorter = _INNERMOST.sub(b"0", prefix)
        if len(shorter) == len(prefix):
            break
        prefix = shorter
    opens = [m.start() for m in _OPEN.finditer(prefix)]
    out = []
    for k, at in enumerate(opens):
        if prefix[at] == ord("{"):
            out.append("[...]")
        else:
            end = opens[k + 1] if k + 1 < len(opens) else len(prefix)
            out.append(f"[{prefix.count(b',', at, end)}]")
    return "".join(out)
