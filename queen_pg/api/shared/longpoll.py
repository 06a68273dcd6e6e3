"""A pop, run while its client is watched: a long-poll whose client went away takes no lease.

While a waiting pop (``wait=true``) is parked or claiming, one small task reads the request's ASGI
``receive`` channel; the server puts ``http.disconnect`` there when the connection closes. It then
marks the client gone and wakes the pop, which stops without claiming, or gives back at once the
lease a claim just took (queen_pg/engine/pop.py). A pop without ``wait`` answers at once and is not
watched. With request fusion on (``QUEEN_FUSE_POPS``), each claim goes through the fuser's pop lane
(queen_pg/engine/fusion.py): pops of other consumer groups on the same queue share its call.
"""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import nullcontext

from fastapi import Request

from queen_pg.api.shared.common import permit, state, tenant
from queen_pg.api.shared.gates import pop_in_maintenance
from queen_pg.db.pool import Record
from queen_pg.engine import pop as pop_engine


class ClientWatch:
    """Sets ``gone`` and ``wake`` when the request's connection closes."""

    def __init__(self, request: Request) -> None:
        self.gone = False
        self.wake = asyncio.Event()
        self._receive = request.receive
        self._task: asyncio.Task[None] | None = None

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                self.wake.set()
                return

    def is_gone(self) -> bool:
        return self.gone

    async def __aenter__(self) -> ClientWatch:
        self._task = asyncio.create_task(self._watch(), name="pop-client-watch")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


async def run_pop(request: Request, req: pop_engine.PopRequest) -> pop_engine.Answer | None:
    """``pop_engine.pop`` for a route: the pop family's permit, pop maintenance, and (with wait) the
    client watched for a disconnect."""
    st = state(request)
    ten = tenant(request)
    fuser = st.fuser
    fetch: pop_engine.Fetch | None = None
    if fuser is not None:  # the fuser holds a pop permit around each procedure call, fused or alone

        async def fetch(call: pop_engine.PopCall, sealed: bool) -> list[Record]:
            return await fuser.pop(ten, call, sealed)

    async def pop(watch: ClientWatch | None) -> pop_engine.Answer | None:
        return await pop_engine.pop(
            st.db,
            st.waiters,
            ten,
            req,
            st.settings.pop_poll_interval_ms / 1000,
            # held around each claim, not while parked (the fuser's own with fusion)
            permit=(lambda: permit(request, "pop")) if fetch is None else nullcontext,
            paused=lambda: pop_in_maintenance(request),
            wake=watch.wake if watch is not None else None,
            gone=watch.is_gone if watch is not None else (lambda: False),
            fetch=fetch,
        )

    if not req.wait:
        return await pop(None)
    async with ClientWatch(request) as watch:
        return await pop(watch)
