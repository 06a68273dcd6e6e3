"""Timer routes (docs/wire.md#timers): schedule, cancel, peek, list.

* ``POST /api/v1/timers`` ``{"operations": [op, ...]}`` → ``{"results": [...]}``, index-aligned.
* ``DELETE /api/v1/timers/{queue}/{timerKey...}[?txn=]`` → one cancel result.
* ``GET /api/v1/timers/{queue}/{timerKey...}`` → the timer or ``{"found": false}`` (200).
* ``GET /api/v1/timers/{queue}[?after=&limit=]`` → ``{rows, truncated, nextAfter}``, cut at the answer budget.

The client sends the queue quoted with ``safe=''`` (a ``/`` in a queue name arrives as ``%2F``) and
the timer key with ``safe='/'`` (raw slashes). The routing path is already percent-decoded, which
would blur the two, so one catch-all route per method splits the RAW path at its first ``/``: before
it the queue, after it the timer key (none = the list). Errors of this family use the broker envelope
``{"error": <code>, "code": <code>, "reason": <stable id>, "detail": <prose>}`` (docs/wire.md#errors), parsed by
the client into ``TimerError``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg.api.shared import decoded
from queen_pg.api.shared.body import decode_family
from queen_pg.api.shared.common import answer_budget, json_response, permit, producer_sub, state, tenant
from queen_pg.api.shared.docs import answers, body, params
from queen_pg.api.shared.envelope import exact_ops
from queen_pg.api.shared.envelope import family_envelope as family_error
from queen_pg.api.shared.params import Param
from queen_pg.api.timers.body import TimersRequest
from queen_pg.api.timers.ops import (
    check_queue_name,
    check_timer_key,
    decode_payloads,
    is_server_owned,
    prepare_timer_ops,
    refuse,
)
from queen_pg.api.timers.schemas import TimerPage, TimerPeek, TimerResult, TimersAnswer
from queen_pg.engine import timers as timers_engine
from queen_pg.errors import NOT_FOUND, TIMERS_BAD_REQUEST, QueenError
from queen_pg.security.access import level
from queen_pg.security.roles import Level

router = APIRouter(prefix="/api/v1")

PREFIX = "/api/v1/timers/"
LIST_DEFAULT = 100
LIST_MAX = 1000

# --- request bodies: the Structs decode; ops.py keeps byte limits, base64/zstd/JSON payloads
# --- and one op per (queue, timerKey) -----------------------------------------------------------

AFTER = Param("after", "list: the page after this timerKey (exclusive)", "text")
LIMIT = Param("limit", "list: rows per page, clamped to 1-1000", "int", LIST_DEFAULT, 1, LIST_MAX, clamp=True)
TXN = Param("txn", "cancel only if the pending timer has this txn", "id")


async def _operations(request: Request) -> object:
    raw = await request.body()
    decode_family(raw, TimersRequest, TIMERS_BAD_REQUEST, owned=is_server_owned)
    return exact_ops(raw)


def _family(read: Callable[[], Any]) -> Any:
    """A query parameter, its 400 in this family's envelope."""
    try:
        return read()
    except QueenError as exc:
        raise refuse("bad_field", str(exc)) from None


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


@router.post(
    "/timers",
    summary="Schedule, reschedule (or cancel) timers in one transaction (docs/wire.md#timers)",
    description="One result per op, in order; `ok: false` (status absent or too_late) is data, HTTP 200. A fired "
    "timer becomes a message in its queue with transactionId = txn and data = the payload. A malformed op "
    "is 400 `timers_bad_request` naming the op index and field; payloads decoding to more than "
    "QUEEN_MAX_DECODED_BYTES together are 413 `decoded_too_large`.",
    openapi_extra=body(TimersRequest),
    responses=answers({200: TimersAnswer}, 400, 413, 429),
)
@level(Level.READ_WRITE)
async def schedule(request: Request) -> Response:
    try:
        prepared = prepare_timer_ops(await _operations(request), in_transaction=False)
        st = state(request)
        async with decoded.expansion(request, "timers") as exp:  # the payloads' bytes held until answered
            await decode_payloads(prepared, exp, in_transaction=False)
            async with permit(request, "kv"):
                results = await timers_engine.apply(
                    st.db,
                    tenant(request),
                    prepared.ops,
                    prepared.payloads,
                    prepared.hashes,
                    prepared.message_ids,
                    producer_sub=producer_sub(request),
                )
    except QueenError as exc:
        return family_error(exc)
    return json_response({"results": results})


@router.delete(
    "/timers/{target:path}",
    summary="Cancel a pending timer: /timers/{queue}/{timerKey...}[?txn=]",
    description="`target` is the queue (percent-encoded, `/` as %2F), a `/`, then the timer key (raw `/` "
    "allowed). A timer that is not pending is 200 `{ok: false, status: absent}`; `too_late` when it is firing.",
    openapi_extra=params(TXN),
    responses=answers({200: TimerResult}, 400, 404, 429),
)
@level(Level.READ_WRITE)
async def cancel(request: Request, target: str) -> Response:
    try:
        queue, key = _target(request)
        if key is None:  # the queue's collection of timers is not a thing to delete
            raise QueenError(NOT_FOUND, detail="no timer key in the path: /api/v1/timers/{queue}/{timerKey}")
        txn = _family(lambda: TXN.read(request))
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
    "(`TimerPage`; follow `nextAfter` while `truncated`), which also stops early when its rows reach the answer "
    "budget (QUEEN_MAX_ANSWER_BYTES; at least one row); the queue, `/`, a timer key: that timer with its "
    "payload as JSON (`data`), or 200 `{found: false}` (`TimerPeek`).",
    openapi_extra=params(AFTER, LIMIT),
    responses=answers({200: TimerPeek | TimerPage}, 400, 429),
)
@level(Level.READ_ONLY)
async def read(request: Request, target: str) -> Response:
    try:
        queue, key = _target(request)
        st = state(request)
        after = _family(lambda: AFTER.read(request))
        limit = _family(lambda: LIMIT.read(request))
        async with permit(request, "kv"):
            if key is not None:
                return json_response(await timers_engine.get(st.db, tenant(request), queue, key))
            page = await timers_engine.list_pending(
                st.db, tenant(request), queue, after, limit, max_bytes=answer_budget(request)
            )
    except QueenError as exc:
        return family_error(exc)
    return json_response(page)
