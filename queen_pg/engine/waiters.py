"""Long-poll waiters: in-process wake-ups for pops parked on a queue.

A waiter takes the queue's current event *before* it tries to claim, so a push that commits after
the attempt started always wakes it. Wake-ups are hints: a lost one costs latency up to the poll
interval, never a message. The number of parked pops is bounded.
"""

from __future__ import annotations

import asyncio


class TooManyWaiters(Exception):
    pass


class Waiters:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parked = 0
        self._events: dict[tuple[str, str], asyncio.Event] = {}
        self._users: dict[tuple[str, str], int] = {}

    def subscribe(self, tenant: str, queue: str) -> asyncio.Event:
        """The event the next push to (tenant, queue) sets; call :meth:`release` when done."""
        key = (tenant, queue)
        ev = self._events.get(key)
        if ev is None:
            ev = self._events[key] = asyncio.Event()
        self._users[key] = self._users.get(key, 0) + 1
        return ev

    def release(self, tenant: str, queue: str) -> None:
        key = (tenant, queue)
        left = self._users.get(key, 0) - 1
        if left <= 0:
            self._users.pop(key, None)
            self._events.pop(key, None)
        else:
            self._users[key] = left

    def notify(self, tenant: str, queue: str) -> None:
        """A push to (tenant, queue) committed: wake everyone parked there."""
        key = (tenant, queue)
        ev = self._events.get(key)
        if ev is not None:
            ev.set()
            self._events[key] = asyncio.Event()  # later subscribers wait for the next push

    async def park(self, ev: asyncio.Event, seconds: float) -> bool:
        """Wait for ``ev`` up to ``seconds``; False when the time ran out."""
        if ev.is_set():
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
