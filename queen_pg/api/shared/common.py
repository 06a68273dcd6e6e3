"""Shared pieces of the routes: app state, permits, JSON responses (bodies: ``body.py``; query
parameters and names: ``params.py``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response

from queen_pg.api.shared.admission import ByteBudget
from queen_pg.api.shared.params import check_name
from queen_pg.db.pool import Database
from queen_pg.engine import pop as pop_engine
from queen_pg.engine import push as push_engine
from queen_pg.engine.fusion import Fuser
from queen_pg.engine.maintenance import Maintenance
from queen_pg.engine.outcomes import Once
from queen_pg.engine.waiters import Waiters
from queen_pg.errors import STORAGE_FULL, QueenError
from queen_pg.jobs.storage import StorageCheck
from queen_pg.limiter import Limiter
from queen_pg.mesh.node import Mesh
from queen_pg.security.access import principal
from queen_pg.server import Transport
from queen_pg.settings import Settings

__all__ = [
    "AppState",
    "answer_budget",
    "check_name",
    "json_response",
    "permit",
    "refuse_when_storage_full",
    "state",
    "tenant",
]


@dataclass(slots=True)
class AppState:
    settings: Settings
    db: Database
    waiters: Waiters
    # overload control (queen_pg/limiter.py, queen_pg/api/shared/admission.py, queen_pg/jobs/storage.py);
    # empty/None = not applied
    limiters: dict[str, Limiter] = field(default_factory=dict)  # route family -> its Vegas limiter
    admission: ByteBudget | None = None
    storage: StorageCheck | None = None
    fuser: Fuser | None = None  # request fusion of pushes and acks (queen_pg/engine/fusion.py); None = off
    # maintenance switches as this process last read them (queen_pg/jobs/maintenance.py)
    maintenance: Maintenance = field(default_factory=Maintenance)
    started_at: float = field(default_factory=time.time)  # wall clock when this state was built
    mesh: Mesh | None = None  # the wake mesh (queen_pg/mesh/); None = not configured
    transport: Transport | None = None  # the HTTP server's side (queen_pg/server.py): draining or not


def wake_pushed(st: AppState, ten: str, queues: Sequence[str]) -> None:
    """After a push (JSON or binary) committed: wake the pops waiting on the queues it appended to
    (``push.Answer.queues``), and once those that name no queue. Also after an ack or transaction that
    left partitions claimable (``AckResults.wake``: a lease released with messages left, a nack)."""
    if queues:
        notify = st.waiters.notify
        for q in queues:
            notify(ten, q)
        notify(ten, pop_engine.ANY_QUEUE)


def state(request: Request) -> AppState:
    st: AppState = request.app.state.queen
    return st


def max_items(request: Request) -> int:
    """Items one request may carry (QUEEN_MAX_ITEMS, api/shared/item_limit.py): beyond it 413 too_many_items."""
    return state(request).settings.max_items


def answer_budget(request: Request) -> int:
    """Bytes an answer that gathers many items may take (QUEEN_MAX_ANSWER_BYTES,
    queen_pg/engine/answers.py): pages stop there, a /kv batch or a transaction's KV reads past it are 413."""
    return state(request).settings.max_answer_bytes


async def push_messages(
    request: Request, ten: str, items: list[push_engine.NewMessage], once: Once | None
) -> push_engine.Answer:
    """Push ``items`` (JSON or binary route) through the fuser, which holds a push permit around each
    procedure call it makes, or alone under the request's own permit when fusion is off."""
    st = state(request)
    if st.fuser is not None:
        return await st.fuser.push(ten, items, once)
    async with permit(request, "push"):
        return await push_engine.push(st.db, ten, items, once)


def permit(request: Request, family: str) -> AbstractAsyncContextManager[None]:
    """A permit of the family's limiter, held around one engine call (429 ``overloaded`` when the
    wait runs out); no limiter for the family, no wait."""
    limiter = state(request).limiters.get(family)
    return limiter.acquire() if limiter is not None else nullcontext()


def refuse_when_storage_full(request: Request) -> None:
    """507 ``storage_full`` for a write that adds messages while the database's storage is full."""
    storage = state(request).storage
    if storage is not None and storage.full:
        raise QueenError(STORAGE_FULL, detail=f"storage is full: {storage.reason}")


def tenant(request: Request) -> str:
    """The request's tenant as the security middleware resolved it (queen_pg/security/tenancy.py)."""
    p = principal(request)
    return p.tenant if p is not None else state(request).settings.default_tenant


def producer_sub(request: Request) -> str | None:
    """The verified token's ``sub`` (JWT on), stamped on pushed messages; None without JWT."""
    p = principal(request)
    return p.sub if p is not None else None


def json_response(data: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(data), status_code=status_code, media_type="application/json", headers=headers)
