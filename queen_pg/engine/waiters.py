"""Long-poll waiters: in-process wake-ups for pops parked on a queue.

Each waiting pop owns one event, registered under its (tenant, queue) key for the whole pop; it
clears the event *before* each claim attempt, so a push that commits after the attempt started
always wakes it. Anyone may set a pop's event: a push (``notify``), the pop's own client going away
(queen_pg/api/longpoll.py), and shutdown (``drain``), after which every pop answers without parking
again. Wake-ups are hints: a lost one costs latency up to the poll interval, never a message. The
number of parked pops is bounded.
"""

from __future__ import annotations

import asyncio


class TooManyWaiters(Exception):
    pass


class Waiters:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parked = 0
        self.draining = False
        self._subs: dict[tuple[str, str], set[asyncio.Event]] = {}

    def subscribe(self, tenant: str, queue: str, ev: asyncio.Event | None = None) -> asyncio.Event:
        """Register ``ev`` (a new event when None) to be set by the next push to (tenant, queue); call
        :meth:`release` with it when done."""
        ev = ev if ev is not None else asyncio.Event()
        self._subs.setdefault((tenant, queue), set()).add(ev)
        if self.draining:
            ev.set()
        return ev

    def release(self, tenant: str, queue: str, ev: asyncio.Event) -> None:
        key = (tenant, queue)
        subs = self._subs.get(key)
        if subs is not None:
            subs.discard(ev)
            if not subs:
                del self._subs[key]

    def notify(self, tenant: str, queue: str) -> None:
        """A push to (tenant, queue) committed: wake everyone waiting there."""
        for ev in self._subs.get((tenant, queue), ()):
            ev.set()

    def drain(self) -> int:
        """Shutdown: wake every waiting pop; from now on none parks. Returns how many long-poll pops
        were running (parked, or between two claims)."""
        self.draining = True
        woken = 0
        for subs in self._subs.values():
            for ev in subs:
                ev.set()
            woken += len(subs)
        return woken

    async def park(self, ev: asyncio.Event, seconds: float) -> bool:
        """Wait for ``ev`` up to ``seconds``; False when the time ran out."""
        if ev.is_set() or self.draining:
            return True
        if self.parked >= self.limit:
            raise TooManyWaiters
        self.parked += 1
        try:
            async with asyncio.timeout(seconds):
                await ev.wait()
            return True
        except TimeoutError:
            return False
        finally:
            self.parked -= 1
