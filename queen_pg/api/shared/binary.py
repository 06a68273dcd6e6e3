"""The binary formats at the HTTP edge (docs/wire.md#binary-formats): a push or transaction whose Content-Type is
``application/x-queen-push`` (QPB1 / QTB1, parsed by queen_pg/engine/binary.py), and the framed pop
answer (QPF1, ``application/x-queen-pop``, queen_pg/engine/pop_frames.py). JSON stays the default: the
routes call in here only when the request's Content-Type (or ``frames=true``) asks for it.

The same rules as the JSON routes hold: names checked by ``check_name`` (413 above 255 bytes), the
body limit (the compressed body by ``BodyLimit``), the cap of decoded bytes (what the zstd frames declare,
charged to admission before the parser inflates them: decoded.py; 413 ``decoded_too_large``), the request
key, the push permit, maintenance and storage refusals, the token's tenant, and the token's ``sub``
as the producerSub (a client's frame carrying one is refused, never trusted). A malformed body is
400 ``bad_binary`` with ``offset`` (the byte where it stopped) and writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from queen_pg.api.shared import admission, decoded, item_limit
from queen_pg.api.shared.common import (
    check_name,
    json_response,
    max_items,
    permit,
    producer_sub,
    push_messages,
    state,
    tenant,
    wake_pushed,
)
from queen_pg.api.shared.counting import count_push
from queen_pg.api.shared.request_key import replay_headers, request_once
from queen_pg.engine import binary, push_binary
from queen_pg.engine import push as push_engine
from queen_pg.engine.outcomes import Once
from queen_pg.engine.pop_frames import CONTENT_TYPE as POP_FRAMES
from queen_pg.errors import BAD_BINARY, DECODED_TOO_LARGE, QueenError
from queen_pg.security import crypto

PUSH_TYPE = "application/x-queen-push"


BODY_DOC = (
    "The binary body (QPB1 on /push, QTB1 on /transaction; docs/wire.md#binary-formats): little-endian, "
    "opt-in by the client "
    "(`binary_push`, `push_compression`). A malformed one is 400 `bad_binary` with `offset`, the byte where it "
    "stopped; nothing is written."
)


def documented(extra: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` of /push and /transaction with the binary body beside the JSON one."""
    content = extra["requestBody"]["content"]
    content[PUSH_TYPE] = {"schema": {"type": "string", "format": "binary", "description": BODY_DOC}}
    return extra


def framed_answer(responses: dict[int | str, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """``responses`` of a pop with the QPF1 answer (``frames=true``) documented beside the JSON one."""
    ok = responses[200]
    ok["content"] = {
        "application/json": {},  # filled from ``model`` by FastAPI
        POP_FRAMES: {"schema": {"type": "string", "format": "binary", "description": "QPF1 (docs/wire.md#framed-pop)"}},
    }
    return responses


def is_binary(request: Request) -> bool:
    """Whether the body is a binary push/transaction body (by its Content-Type, parameters ignored)."""
    ctype = request.headers.get("content-type")
    return ctype is not None and ctype.split(";", 1)[0].strip().lower() == PUSH_TYPE


def _malformed(exc: binary.Malformed, limit: int, max_items: int) -> QueenError:
    if isinstance(exc, binary.TooLarge):  # decompressed past the cap of decoded bytes
        return QueenError(DECODED_TOO_LARGE, detail=f"the binary body ({exc.what})", limit=limit, offset=exc.offset)
    if isinstance(exc, binary.TooMany):  # counted off the groups' headers, before their messages are read
        err = item_limit.too_many("the binary body", max_items, exc.count)
        err.fields["offset"] = exc.offset
        return err
    return QueenError(BAD_BINARY, detail=str(exc), offset=exc.offset)


async def _parse(
    request: Request, data: bytes, exp: decoded.Expansion, parse: Callable[[bytes, int, int], binary.Body]
) -> binary.Body:
    """``parse(data, cap, max_items)``: what its zstd frames declare is counted and charged first (a bomb
    is refused before it inflates); a big one is parsed off the event loop."""
    size = binary.declared_expansion(data)
    cap = max_items(request)
    try:
        await exp.reserve(size, "the binary body")
        return await decoded.off_loop(size + len(data), parse, data, exp.cap, cap)
    except binary.Malformed as exc:
        raise _malformed(exc, exp.cap, cap) from None


def _check_names(groups: list[binary.Group]) -> None:
    for g in groups:
        check_name("queue", g.queue)
        if g.partition != "Default":
            check_name("partition", g.partition)


async def _stored(request: Request, ten: str, groups: list[binary.Group], once: Once | None) -> push_engine.Answer:
    st = state(request)
    if st.fuser is None:
        async with permit(request, "push"):
            return await push_binary.push(st.db, ten, groups, once)
    return await st.fuser.push_stored(ten, groups, once)


async def push(request: Request) -> Response:
    """``POST /api/v1/push`` with a QPB1 body: the JSON push's answer (or, flag 2, its counts)."""
    async with decoded.expansion(request, "push") as exp:  # the decoded bytes held until answered
        return await _push(request, await _parse(request, await request.body(), exp, binary.parse_push))


async def _push(request: Request, body: binary.Body) -> Response:
    st = state(request)
    _check_names(body.groups)
    await admission.charge_items(request.scope, sum(len(g) for g in body.groups))
    ten = tenant(request)
    sub = producer_sub(request)
    once = await request_once(request, "push")
    # the permit of the push limiter is held around each procedure call: by the fusion lanes, else here
    if body.framed and push_binary.stored_as_is(crypto.vault(st.db), ten, body.groups, sub):
        results = await _stored(request, ten, body.groups, once)
    else:
        results = await push_messages(request, ten, push_binary.messages(body.groups, sub), once)
    wake_pushed(st, ten, results.queues)
    count_push(request, ten, results)
    if body.counts_only:
        return json_response(push_binary.counts(results), 201, replay_headers(once))
    return Response(results.body, 201, replay_headers(once), "application/json")


@dataclass(slots=True)
class FramedPushes:
    """The pushes of a QTB1 body: its messages, and (when stored as they came) push_v1's arguments."""

    items: list[push_engine.NewMessage]
    prepared: push_engine.PreparedPush | None
    counts_only: bool


async def transaction_body(request: Request, exp: decoded.Expansion) -> tuple[bytes, FramedPushes]:
    """A QTB1 body as (the JSON head, its pushes); the route runs the head as a JSON transaction with
    the pushes after its operations (their results follow the head's, docs/wire.md#binary-transaction). What it decodes
    to is charged to ``exp``, which the route holds until it has answered."""
    body = await _parse(request, await request.body(), exp, binary.parse_transaction)
    _check_names(body.groups)
    await admission.charge_items(request.scope, sum(len(g) for g in body.groups))
    sub = producer_sub(request)
    items = push_binary.messages(body.groups, sub)
    fast = bool(body.groups) and push_binary.stored_as_is(
        crypto.vault(state(request).db), tenant(request), body.groups, sub
    )
    return body.head, FramedPushes(items, push_binary.prepare(body.groups) if fast else None, body.counts_only)


def counted(answer: dict[str, Any], slots: int) -> dict[str, Any]:
    """A QTB1 flag-2 answer: the acks' and pushes' results (the first ``slots``) left out and counted
    (``pushed``, ``duplicate``, ``acked``); the riders' results stay. A verdict is unchanged."""
    if not answer.get("success"):
        return answer
    results = answer["results"]
    ops = results[:slots]
    pushed = sum(1 for r in ops if r.get("type") == "push" and r.get("status") == "queued")
    dups = sum(1 for r in ops if r.get("type") == "push" and r.get("status") == "duplicate")
    acked = sum(1 for r in ops if r.get("type") == "ack")
    return {**answer, "results": results[slots:], "pushed": pushed, "duplicate": dups, "acked": acked}
