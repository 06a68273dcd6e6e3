"""The error catalog: one stable code per failure, its HTTP status and a message template.

Procedures and engine code raise :class:`QueenError` with a catalog code; one handler in
``queen_pg.api`` renders it as ``{"error": <message>, "code": <code>}``.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ErrorKind:
    code: str
    status: int
    template: str


BAD_JSON = ErrorKind("bad_json", 400, "request body is not valid JSON: {detail}")
BAD_REQUEST = ErrorKind("bad_request", 400, "{detail}")
# A malformed binary body (docs/wire.md#binary-formats, queen_pg/engine/binary.py): the answer also carries `offset`.
BAD_BINARY = ErrorKind("bad_binary", 400, "malformed binary body: {detail}")
NAME_TOO_LONG = ErrorKind("name_too_long", 413, "{what} name is {size} bytes; the limit is {limit}")
BODY_TOO_LARGE = ErrorKind("body_too_large", 413, "request body exceeds {limit} bytes")
# What a request expands to when decoded (zstd, base64: queen_pg/api/shared/decoded.py), over the request.
DECODED_TOO_LARGE = ErrorKind(
    "decoded_too_large", 413, "{detail}: a request may decode to at most {limit} bytes (QUEEN_MAX_DECODED_BYTES)"
)
NOT_FOUND = ErrorKind("not_found", 404, "{detail}")
CONFLICT = ErrorKind("conflict", 409, "{detail}")
RETRY = ErrorKind("retry", 503, "{detail}; retry the request")
DB_UNAVAILABLE = ErrorKind("db_unavailable", 503, "database unavailable: {detail}")
# The 500 answer never carries the cause (driver or PostgreSQL text): only a request id, which the one
# log line with the cause and traceback also carries (queen_pg/api/shared/internal.py, queen_pg/db/pool.py).
INTERNAL = ErrorKind("internal", 500, "internal error (request id {request_id}); the cause is in the broker's log")

# KV and locks families (docs/wire.md#errors): rendered as {"error": code, "code", "reason", "detail"} by
# queen_pg/api/kv/routes.py; `reason` (a stable id) comes in the QueenError's fields.
KV_BAD_REQUEST = ErrorKind("kv_bad_request", 400, "{detail}")
LOCKS_BAD_REQUEST = ErrorKind("locks_bad_request", 400, "{detail}")

CATALOG: dict[str, ErrorKind] = {
    k.code: k
    for k in (BAD_JSON, BAD_REQUEST, NAME_TOO_LONG, BODY_TOO_LARGE, NOT_FOUND, RETRY, DB_UNAVAILABLE, INTERNAL)
}
CATALOG[BAD_BINARY.code] = BAD_BINARY
CATALOG[DECODED_TOO_LARGE.code] = DECODED_TOO_LARGE
# Items of one request (push messages, acknowledgments, a transaction's operations: api/shared/item_limit.py),
# counted before any is built.
TOO_MANY_ITEMS = ErrorKind(
    "too_many_items", 413, "{detail}; a request may carry at most {limit} items (QUEEN_MAX_ITEMS)"
)
CATALOG[TOO_MANY_ITEMS.code] = TOO_MANY_ITEMS
CATALOG.update({k.code: k for k in (KV_BAD_REQUEST, LOCKS_BAD_REQUEST)})

# Timers family (docs/wire.md#timers, docs/wire.md#errors): rendered as {"error": code, "code", "reason", "detail"} by
# queen_pg/api/timers/routes.py; `reason` (a stable id) comes in the QueenError's fields.
TIMERS_BAD_REQUEST = ErrorKind("timers_bad_request", 400, "{detail}")
CATALOG[TIMERS_BAD_REQUEST.code] = TIMERS_BAD_REQUEST

# Overload (queen_pg/limiter.py, queen_pg/api/shared/admission.py): a 429 carries `retry_after` (seconds, 1-5)
# in its fields, rendered as the Retry-After header; storage_full refuses writes, reads still served.
OVERLOADED = ErrorKind("overloaded", 429, "{detail}")
STORAGE_FULL = ErrorKind("storage_full", 507, "{detail}")
CATALOG.update({k.code: k for k in (OVERLOADED, STORAGE_FULL)})

# Push maintenance (queen_pg/api/status/system.py): pushes refused with 503 + Retry-After until it is off.
MAINTENANCE = ErrorKind("maintenance", 503, "{detail}")
CATALOG[MAINTENANCE.code] = MAINTENANCE

# The lame duck after SIGTERM (queen_pg/server.py): /health tells the proxy to stop routing here.
DRAINING = ErrorKind("draining", 503, "this replica is shutting down; send requests to another one")
CATALOG[DRAINING.code] = DRAINING

# Outcome window (sql/procedures/096_outcomes.sql, raised there by queen._refuse): the request key
# already answered another request (another body or route) within the window.
IDEMPOTENCY_KEY_REUSED = ErrorKind("idempotency_key_reused", 422, "{detail}")
CATALOG[IDEMPOTENCY_KEY_REUSED.code] = IDEMPOTENCY_KEY_REUSED


# A request head or body that stops arriving (queen_pg/server.py: QUEEN_HEADER_TIMEOUT_S,
# QUEEN_BODY_IDLE_TIMEOUT_S): answered by the protocol, which then closes the connection.
REQUEST_TIMEOUT = ErrorKind("request_timeout", 408, "{detail}")
CATALOG[REQUEST_TIMEOUT.code] = REQUEST_TIMEOUT
# A request head (request line and headers) past QUEEN_MAX_HEAD_BYTES (queen_pg/server.py): answered by
# the protocol before the bytes reach the HTTP parser, which then closes the connection.
HEAD_TOO_LARGE = ErrorKind("head_too_large", 431, "request head exceeds {limit} bytes (QUEEN_MAX_HEAD_BYTES)")
CATALOG[HEAD_TOO_LARGE.code] = HEAD_TOO_LARGE

# The answer budget (QUEEN_MAX_ANSWER_BYTES): a read that cannot page (a /kv batch) and would answer
# more is refused, by queen._refuse in sql/procedures/080_kv.sql; the detail names the limit.
ANSWER_TOO_LARGE = ErrorKind("answer_too_large", 413, "{detail}")
CATALOG[ANSWER_TOO_LARGE.code] = ANSWER_TOO_LARGE


# Security (queen_pg/security/): answered by its middleware before any route runs.
UNAUTHORIZED = ErrorKind("unauthorized", 401, "{detail}")  # + WWW-Authenticate: Bearer
FORBIDDEN = ErrorKind("forbidden", 403, "{detail}")
UNSUPPORTED_MEDIA_TYPE = ErrorKind("unsupported_media_type", 415, "{detail}")
BAD_HOST = ErrorKind("bad_host", 400, "{detail}")
CATALOG.update({k.code: k for k in (UNAUTHORIZED, FORBIDDEN, UNSUPPORTED_MEDIA_TYPE, BAD_HOST)})
# A browser request from another site to a route that changes state (queen_pg/security/middleware.py):
# refused before it is authenticated or parsed, so it writes nothing.
CROSS_SITE = ErrorKind("cross_site", 403, "{detail}")
CATALOG[CROSS_SITE.code] = CROSS_SITE

# Encrypted queues (queen_pg/security/crypto.py): a broker without the key an encrypted queue needs is a
# configuration error, not an outage (409, no Retry-After); encryption_mismatch is raised by
# queen.push_v1 (nothing written) and retried by the broker, so a client sees it only when a queue's
# encryption flips several times during one request.
ENCRYPTION_KEY_MISSING = ErrorKind("encryption_key_missing", 409, "{detail}")
ENCRYPTION_KEY_UNKNOWN = ErrorKind("encryption_key_unknown", 409, "{detail}")
ENCRYPTION_MISMATCH = ErrorKind("encryption_mismatch", 503, "{detail}")
CATALOG.update({k.code: k for k in (ENCRYPTION_KEY_MISSING, ENCRYPTION_KEY_UNKNOWN, ENCRYPTION_MISMATCH)})


class QueenError(Exception):
    """A failure with a catalog code; rendered as JSON by the API's single handler."""

    def __init__(self, kind: ErrorKind, **fields: Any) -> None:
        self.kind = kind
        self.fields = fields
        try:
            message = kind.template.format(**fields)
        except (KeyError, IndexError):
            message = kind.template
        super().__init__(message)

    @property
    def status(self) -> int:
        return self.kind.status

    @property
    def code(self) -> str:
        return self.kind.code

    def body(self) -> dict[str, Any]:
        out = {"error": str(self), "code": self.kind.code}
        if "request_id" in self.fields:
            out["requestId"] = str(self.fields["request_id"])
        if "offset" in self.fields:
            out["offset"] = self.fields["offset"]
        return out

    def headers(self) -> dict[str, str] | None:
        """``Retry-After`` for the statuses a client should retry: 503 (1 s) and 429 (its own)."""
        if self.status == 503:
            return {"Retry-After": "1"}
        if self.status == 429:
            return {"Retry-After": str(self.fields.get("retry_after", 1))}
        return None


_LOG_UNSAFE = re.compile(r'[\x00-\x20"\\\x7f-\x9f\u2028\u2029]')


def log_value(value: object) -> str:
    """A value for a ``key=value`` log line: as it is, or JSON-quoted (ASCII escapes) when it holds a
    space, a quote, a backslash or a control character, so that a client's path or text can neither
    end the line nor pass for another key."""
    text = str(value)
    return json.dumps(text) if _LOG_UNSAFE.search(text) else text


def internal(log: logging.Logger, exc: BaseException, **context: object) -> QueenError:
    """The 500 for an unexpected ``exc``: one log line ``event=internal_error request_id=...`` with the
    cause and its traceback; the answer carries only the request id."""
    rid = secrets.token_hex(8)
    where = "".join(f" {k}={log_value(v)}" for k, v in context.items())
    cause = log_value(f"{exc.__class__.__name__}: {exc}")
    log.error("event=internal_error request_id=%s%s error=%s", rid, where, cause, exc_info=exc)
    return QueenError(INTERNAL, request_id=rid)


def bad_request(detail: str) -> QueenError:
    return QueenError(BAD_REQUEST, detail=detail)


class Verdict(Exception):
    """A refusal decided in SQL (``queen._verdict``): the call wrote nothing and the route answers it
    as an HTTP 200 body. ``reason`` is the stable id (e.g. ``kv_precondition``), ``detail`` the rest."""

    def __init__(self, reason: str, detail: dict[str, Any]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail
