"""Timer routes (WIRE.md §2.8): schedule, cancel, peek, list.

* ``POST /api/v1/timers`` ``{"operations": [op, ...]}`` → ``{"results": [...]}``, index-aligned.
* ``DELETE /api/v1/timers/{queue}/{timerKey...}[?txn=]`` → one cancel result.
* ``GET /api/v1/timers/{queue}/{timerKey...}`` → the timer or ``{"found": false}`` (200).
* ``GET /api/v1/timers/{queue}[?after=&limit=]`` → ``{rows, truncated, nextAfter}``.

The client sends the queue quoted with ``safe=''`` (a ``/`` in a queue name arrives as ``%2F``) and
the timer key with ``safe='/'`` (raw slashes). The routing path is already percent-decoded, which
would blur the two, so one catch-all route per method splits the RAW path at its first ``/``: before
it the queue, after it the timer key (none = the list). Errors of this family use the broker envelope
``{"error": <code>, "code": <code>, "reason": <stable id>, "detail": <prose>}`` (WIRE.md §4), parsed by
the client into ``TimerError``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg.api.common import json_response, permit, state, tenant
from queen_pg.api.docs import answers, body, params, query
from queen_pg.api.schemas_timers import TimerPage, TimerPeek, TimerResult, TimersAnswer, TimersRequest
from queen_pg.api.timer_ops import check_queue_name, check_timer_key, prepare_timer_ops, refuse
from queen_pg.engine import timers as timers_engine
from queen_pg.errors import QueenError

router = APIRouter(prefix="/api/v1")

PREFIX = "/api/v1/timers/"
LIST_DEFAULT = 100
LIST_MAX = 1000


def family_error(exc: QueenError) -> Response:
    """The timers error envelope; 503s and 429s keep ``Retry-After`` like every other route."""
    body = {
        "error": exc.code,
        "code": exc.code,
        "reason": str(exc.fields.get("reason") or exc.code),
        "detail": str(exc),
    }
    return json_response(body, exc.status, exc.headers())


async def _operations(request: Request) -> object:
    raw = await request.body()
    if not raw.strip():
        raise refuse("bad_body", 'request body is empty; expected {"operations": [...]}')
    try:
        body: Any = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise refuse("bad_json", f"request body is not valid JSON: {err}") from None
    if not isinstance(body, dict) or "operations" not in body:
        raise refuse("bad_body", 'request body must be an object {"operations": [...]}')
    return body["operations"]


def _target(request: Request) -> tuple[str, str | None]:
    """(queue, timer key or None) from the raw request path."""
    raw_path: bytes | None = request.scope.get("raw_path")
    path = raw_path.decode("latin-1") if raw_path else request.url.path
    rest = path[path.find(PREFIX) + len(PREFIX) :] if PREFIX in path else ""
    raw_queue, slash, raw_key = rest.partition("/")
    try:
        queue = unquote(raw_queue, errors="strict")
        key = unquote(raw_key, errors="strict") if slash else None
    except UnicodeDecodeError:
        raise refuse("bad_field", "the path is not valid percent-encoded UTF-8") from None
    check_queue_name(queue, "path queue")
    if key is not None:
        check_timer_key(key, "path timerKey")
    return queue, key


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit")
    if raw is None or raw == "":
        return LIST_DEFAULT
    try:
        value = int(raw)
    except ValueError:
        raise refuse("bad_field", f"query parameter limit must be an integer, got {raw!r}") from None
    return min(max(value, 1), LIST_MAX)  # clamped, never refused (the client's list() contract)


@router.post(
    "/timers",
    summary="Schedule, reschedule (or cancel) timers in one transaction (WIRE §2.8)",
    description="One result per op, in order; `ok: false` (status absent or too_late) is data, HTTP 200. A fired "
    "timer becomes a message in its queue with transactionId = txn and data = the payload. A malformed op "
    "is 400 `timers_bad_request` naming the op index and field.",
    openapi_extra=body(TimersRequest),
    responses=answers({200: TimersAnswer}, 400, 413, 429),
)
async def schedule(request: Request) -> Response:
    try:
        prepared = prepare_timer_ops(await _operations(request), in_transaction=False)
        st = state(request)
        async with permit(request, "kv"):
            results = await timers_engine.apply(
                st.db, tenant(request), prepared.ops, prepared.payloads, prepared.hashes, prepared.message_ids
            )
    except QueenError as exc:
        return family_error(exc)
    return json_response({"results": results})


@router.delete(
    "/timers/{target:path}",
    summary="Cancel a pending timer: /timers/{queue}/{timerKey...}[?txn=]",
    description="`target` is the queue (percent-encoded, `/` as %2F), a `/`, then the timer key (raw `/` "
    "allowed). A timer that is not pending is 200 `{ok: false, status: absent}`; `too_late` when it is firing.",
    openapi_extra=params(query("txn", "cancel only if the pending timer has this txn")),
    responses=answers({200: TimerResult}, 400, 429),
)
async def cancel(request: Request, target: str) -> Response:
    try:
        queue, key = _target(request)
        if key is None:
            raise refuse("missing_field", "the timer key is missing from the path: /api/v1/timers/{queue}/{timerKey}")
        txn = request.query_params.get("txn") or None
        st = state(request)
        async with permit(request, "kv"):
            result = await timers_engine.cancel(st.db, tenant(request), queue, key, txn)
    except QueenError as exc:
        return family_error(exc)
    return json_response(result)


@router.get(
    "/timers/{target:path}",
    summary="Peek one timer (/timers/{queue}/{timerKey...}) or list a queue's pending timers (/timers/{queue})",
    description="`target` = the queue (percent-encoded) alone: a keyset page of its pending timers by timerKey "
    "(`TimerPage`; follow `nextAfter` while `truncated`); the queue, `/`, a timer key: that timer, or 200 "
    "`{found: false}` (`TimerPeek`).",
    openapi_extra=params(
        query("after", "list: the page after this timerKey (exclusive)"),
        query("limit", "list: rows per page, clamped to 1-1000", type="integer", default=100),
    ),
    responses=answers({200: TimerPeek | TimerPage}, 400, 429),
)
async def read(request: Request, target: str) -> Response:
    try:
        queue, key = _target(request)
        st = state(request)
        after = request.query_params.get("after") or None
        limit = _limit(request)
        async with permit(request, "kv"):
            if key is not None:
                return json_response(await timers_engine.get(st.db, tenant(request), queue, key))
            page = await timers_engine.list_pending(st.db, tenant(request), queue, after, limit)
    except QueenError as exc:
        return family_error(exc)
    return json_response(page)
