"""Query parameters: one spec per parameter that both documents it (``/openapi.json``) and reads it.

A :class:`Param` is declared once, beside its route or here when shared; ``docs.params(p.doc(), ...)``
documents it and ``p.read(request)`` parses it with the same limits. Rules common to every kind: an
absent parameter is its default; a present but empty one is absent for names and free text, and a 400
for numbers, booleans, choices and timestamps (the schema says so: ``minLength`` or a format). Names
and ids follow the identifier rule of queen_pg/text.py (no control character), free text holds no
U+0000 (docs/wire.md#text).

Timestamps are RFC 3339 with a zone (``msgspec``'s parser, which is what ``format: date-time``
means); an instant before 0001-01-01 or after 9999-12-31 UTC (``0001-01-01T00:00:00+05:00``) reads as
the first or last instant Python can hold: no message is written outside that range, so a window or a
seek from there selects the same messages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import msgspec
from fastapi import Request

from queen_pg import text
from queen_pg.api.shared.body import INT64, MAX_NAME, NAME_DOC
from queen_pg.engine import admin
from queen_pg.errors import NAME_TOO_LONG, QueenError, bad_request

__all__ = ["INT64", "Param", "check_id", "check_name", "page", "parse_timestamp", "utc"]

Kind = Literal["name", "id", "text", "int", "bool", "choice", "time"]
ISO = "RFC 3339 timestamp with a zone (e.g. 2026-01-01T00:00:00Z)"
_Aware = Annotated[datetime, msgspec.Meta(tz=True)]
_TIME = msgspec.json.Decoder(_Aware)
EARLIEST = datetime.min.replace(tzinfo=UTC)
LATEST = datetime.max.replace(tzinfo=UTC)


def check_name(what: str, name: str) -> str:
    """A name: 1-255 bytes of UTF-8 (413 ``name_too_long`` above), no control character (docs/wire.md#text)."""
    if not name:
        raise bad_request(f"{what} name must be a non-empty string")
    size = len(name.encode())
    if size > MAX_NAME:
        raise QueenError(NAME_TOO_LONG, what=what, size=size, limit=MAX_NAME)
    if text.has_control(name):
        raise bad_request(f"{what} name {text.MESSAGE}")
    return name


def check_id(what: str, value: str) -> str:
    """An identifier that is not a name (a transactionId, a lease id): non-empty, no control character."""
    if not value:
        raise bad_request(f"{what} is required")
    if text.has_control(value):
        raise bad_request(f"{what} {text.MESSAGE}")
    return value


def utc(ts: datetime) -> datetime:
    """``ts`` in UTC; an instant beyond Python's range is clamped to its first or last instant."""
    try:
        return ts.astimezone(UTC)
    except OverflowError:
        return EARLIEST if ts.year == 1 else LATEST


def parse_timestamp(name: str, raw: str, *, now_ok: bool = False) -> datetime:
    """An RFC 3339 timestamp with a zone (``now`` too when ``now_ok``), in UTC."""
    if now_ok and raw == "now":
        return datetime.now(UTC)
    try:
        ts = _TIME.decode(msgspec.json.encode(raw))
    except (msgspec.ValidationError, msgspec.DecodeError):
        also = " or 'now'" if now_ok else ""
        raise bad_request(f"{name} must be an {ISO}{also}, got {raw!r}") from None
    return utc(ts)


def time_schema(now_ok: bool) -> dict[str, Any]:
    if now_ok:
        return {"type": "string", "anyOf": [{"format": "date-time"}, {"enum": ["now"]}]}
    return {"type": "string", "format": "date-time"}


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    description: str
    kind: Kind = "name"
    default: Any = None
    lo: int | None = None
    hi: int | None = None
    clamp: bool = False  # int: out of lo..hi is clamped, never refused
    choices: tuple[str, ...] = ()
    now_ok: bool = False  # time: `now` is accepted
    required: bool = False

    def doc(self) -> dict[str, Any]:
        schema: dict[str, Any]
        if self.kind == "name":
            schema = {"type": "string", "maxLength": MAX_NAME, "pattern": text.PATTERN}
        elif self.kind == "id":
            schema = {"type": "string", "pattern": text.PATTERN}
        elif self.kind == "text":
            schema = {"type": "string", "pattern": text.FREE_TEXT_PATTERN}
        elif self.kind == "int":
            schema = {"type": "integer"}
            if not self.clamp:
                schema.update({k: v for k, v in (("minimum", self.lo), ("maximum", self.hi)) if v is not None})
        elif self.kind == "bool":
            schema = {"type": "boolean"}
        elif self.kind == "choice":
            schema = {"type": "string", "enum": list(self.choices)}
        else:
            schema = time_schema(self.now_ok)
        if self.required and self.kind in ("name", "id", "text"):
            schema["minLength"] = 1
        if self.default is not None and self.kind != "time":
            schema["default"] = self.default
        description = self.description
        if self.kind == "name":
            description += f" ({NAME_DOC}; empty = absent)"
        elif self.kind == "id":
            description += f" ({text.RULE}; empty = absent)"
        return {
            "name": self.name,
            "in": "query",
            "required": self.required,
            "description": description,
            "schema": schema,
        }

    def read(self, request: Request) -> Any:
        raw = request.query_params.get(self.name)
        if raw is None or (raw == "" and self.kind in ("name", "id", "text")):
            if self.required:
                raise bad_request(f"query parameter {self.name} is required")
            return self.default
        if self.kind == "name":
            return check_name(self.name, raw)
        if self.kind == "id":
            return check_id(f"query parameter {self.name}", raw)
        if self.kind == "text":
            if "\x00" in raw:
                raise bad_request(f"query parameter {self.name} {text.FREE_TEXT_MESSAGE}")
            return raw
        if self.kind == "int":
            return self._int(raw)
        if self.kind == "bool":
            if raw in ("true", "false"):
                return raw == "true"
            raise bad_request(f"query parameter {self.name} must be true or false, got {raw!r}")
        if self.kind == "choice":
            if raw in self.choices:
                return raw
            raise bad_request(f"query parameter {self.name} must be one of {', '.join(self.choices)}, got {raw!r}")
        return parse_timestamp(self.name, raw, now_ok=self.now_ok)

    def _int(self, raw: str) -> int:
        if not re.fullmatch(r"-?[0-9]{1,40}", raw):
            raise bad_request(f"query parameter {self.name} must be an integer (at most 40 digits), got {raw[:50]!r}")
        value = int(raw)
        lo, hi = self.lo, self.hi
        if self.clamp:
            return min(max(value, lo if lo is not None else value), hi if hi is not None else value)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise bad_request(f"query parameter {self.name} must be between {lo} and {hi}, got {value}")
        return value


def page(default: int = 100, most: int = 1000, max_offset: int = 2**31 - 1) -> tuple[Param, Param]:
    """``limit`` (1..most) and ``offset`` (0..max_offset) of a paged list."""
    return (
        Param("limit", f"page size, 1-{most}", "int", default, 1, most),
        Param("offset", "rows to skip", "int", 0, 0, max_offset),
    )


def read_page(request: Request, spec: tuple[Param, Param]) -> tuple[int, int]:
    limit, offset = spec
    return limit.read(request), offset.read(request)


# --- paging of the list routes ---------------------------------------------------------------

DEFAULT_PAGE = 100
MAX_PAGE = 1000
MAX_OFFSET = 2**31 - 1
PAGE = page(DEFAULT_PAGE, MAX_PAGE, MAX_OFFSET)


def page_params(request: Request, spec: tuple[Param, Param] = PAGE) -> admin.Page:
    """``limit`` and ``offset`` of a paged list (documented by the same ``spec``); anything else is a 400."""
    return admin.Page(*read_page(request, spec))


# --- a message named in the path: /messages/{partitionId}/{transactionId} -------------------------


def partition_id_param(raw: str) -> int:
    try:
        pid = int(raw)
    except ValueError:
        raise bad_request(f"partitionId must be the numeric id a pop returned, got {raw!r}") from None
    if not 0 < pid < 2**63:
        raise bad_request(f"partitionId must be a positive 64-bit integer, got {raw!r}")
    return pid


def message_key(partition_id: str, transaction_id: str) -> tuple[int, str]:
    return partition_id_param(partition_id), check_id("transactionId", transaction_id)
