"""Long-poll waiters: in-process wake-ups for pops parked on a queue.

Each waiting pop owns one event, registered under its (tenant, queue) key for the whole pop; it
clears the event *before* each claim attempt, so a push that commits after the attempt started
always wakes it. Anyone may set a pop's event: a push (``notify``), the pop's own client going away
(queen_pg/api/shared/longpoll.py), and shutdown (``drain``), after which every pop answers without parking
again. Wake-ups are hints: a lost one costs latency up to the shared re-check, never a message. The
number of parked pops is bounded, and with tenancy on each tenant may hold only its part of that
bound (``tenant_share``, :func:`queen_pg.limiter.tenant_part`), so one tenant parking all it can still
leaves room for the others.

:meth:`Waiters.notify` is what the engine calls when a queue got messages, or a partition holding some
became claimable (an ack released its lease, a nack, a lease given back): it wakes this process's
pops and hands the news to the sinks (the mesh, ``queen_pg/mesh/``, which tells the other replicas
and workers; the engine never imports it). :meth:`Waiters.wake` is the local half, used for wakes
that come from a peer. :meth:`Waiters.wake_after` schedules a local wake (a lease this process
handed out expires then). Pops parked on the same thing share their database re-check
(``queen_pg/engine/probes.py``).

Interest (:meth:`Waiters.watch_interest`, used by the mesh between the workers of one host): the
(tenant, queue) keys pops wait on here, each with the monotonic time it became one. A key stays of
interest until it has had no subscriber for the mesh's linger (so a consumer that re-polls does
not flip it per pop). A key that becomes of interest again bumps its probe groups' epochs: while
it was not of interest the siblings did not send its wakes, so a group's "known empty" is stale.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

from queen_pg.engine.probes import Probe
from queen_pg.limiter import tenant_part

Sink = Callable[[str, str], None]
InterestSink = Callable[[str, str, float], None]


def tenant_of(key: tuple[object, ...]) -> str:
    return str(key[0])


def queue_of(key: tuple[object, ...]) -> str:
    return str(key[1])


class TooManyWaiters(Exception):
    """No room to park: the process's bound, or the tenant's part of it, is reached."""


class Waiters:
    def __init__(self, limit: int, poll_min: float = 1.0, poll_max: float = 10.0, tenant_share: float = 1.0) -> None:
        self.limit = limit
        self.parked = 0
        self.tenant_limit = tenant_part(limit, tenant_share)  # None: no per-tenant part (tenancy off)
        self._parked_by: dict[str, int] = {}  # tenant -> pops parked now (only tenants with some)
        self.draining = False
        self._subs: dict[tuple[str, str], set[asyncio.Event]] = {}
        self.poll_min = poll_min
        self.poll_max = max(poll_max, poll_min)
        self.probes = 0  # database re-checks made by parked pops (safety net), for metrics
        self.skipped = 0  # claims skipped because the queue was known empty, for metrics
        self.lookups = 0  # look-ups of when held-back messages become visible (pop.schedule_visible_wake)
        self._groups: dict[tuple[object, ...], Probe] = {}
        self._by_queue: dict[tuple[str, str], dict[tuple[object, ...], Probe]] = {}  # wake -> groups
        self._timers: dict[tuple[str, str, int], asyncio.TimerHandle] = {}
        self._sinks: list[Sink] = []
        self._rng = random.Random()
        self._keep = max(4 * limit, 1024)  # idle probe groups kept (their "known empty" state), timers
        self._on_interest: InterestSink | None = None  # set by watch_interest (the mesh, sibling workers)
        self._interest: dict[tuple[str, str], float] = {}  # key -> monotonic time it became of interest
        self._idle: dict[tuple[str, str], float] = {}  # keys of interest without a subscriber -> since

    def watch_interest(self, sink: InterestSink) -> None:
        """Track the keys pops wait on: ``sink(tenant, queue, since)`` hears each key that becomes of
        interest (``since``: ``time.monotonic()`` then, taken before the pop's first claim)."""
        self._on_interest = sink

    def interest(self) -> dict[tuple[str, str], float]:
        """The keys of interest now, with the time each became one."""
        return dict(self._interest)

    def expire_interest(self, now: float, linger: float) -> list[tuple[str, str]]:
        """Forget (and return) the keys without a subscriber since ``linger`` seconds before ``now``."""
        gone = [k for k, since in self._idle.items() if now - since >= linger and k not in self._subs]
        for k in gone:
            del self._idle[k]
            self._interest.pop(k, None)
        return gone

    def add_sink(self, sink: Sink) -> None:
        """``sink(tenant, queue)`` hears every :meth:`notify` (the mesh)."""
        self._sinks.append(sink)

    def probe(
        self,
        tenant: str,
        queue: str,
        *scope: object,
        poll_min: float | None = None,
        member: asyncio.Event | None = None,
    ) -> Probe:
        """The shared re-check of the pops parked on (tenant, queue, *scope); :meth:`leave` when done.
        Its first re-check comes ``poll_min`` (default: the waiters') after an empty look. ``member``:
        the pop's event, which the group may set to hand it the re-check (``Probe.leave``)."""
        key = (tenant, queue, *scope)
        g = self._groups.get(key)
        if g is None:
            if len(self._groups) >= self._keep:  # forget idle groups (their state is only an optimisation)
                for k in [k for k, v in self._groups.items() if v.users == 0]:
                    del self._groups[k]
                    by = self._by_queue.get((tenant_of(k), queue_of(k)))
                    if by is not None:
                        by.pop(k, None)
                        if not by:
                            del self._by_queue[(tenant_of(k), queue_of(k))]
            first = self.poll_min if poll_min is None else poll_min
            g = self._groups[key] = Probe(first, max(self.poll_max, first), self._rng)
            self._by_queue.setdefault((tenant, queue), {})[key] = g
        g.users += 1
        if member is not None:
            g.join(member)
        return g

    def leave(self, probe: Probe, member: asyncio.Event | None = None) -> None:
        probe.users -= 1
        if member is not None:
            probe.leave(member)

    def subscribe(self, tenant: str, queue: str, ev: asyncio.Event | None = None) -> asyncio.Event:
        """Register ``ev`` (a new event when None) to be set by the next push to (tenant, queue); call
        :meth:`release` with it when done."""
        ev = ev if ev is not None else asyncio.Event()
        key = (tenant, queue)
        subs = self._subs.get(key)
        if subs is None:
            subs = self._subs[key] = set()
            if self._on_interest is not None:
                if self._idle.pop(key, None) is None and key not in self._interest:
                    since = self._interest[key] = time.monotonic()
                    for g in self._by_queue.get(key, {}).values():
                        g.epoch += 1  # its wakes were not sent here while nobody waited: stale
                    self._on_interest(tenant, queue, since)
        subs.add(ev)
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
                if self._on_interest is not None and key in self._interest:
                    self._idle[key] = time.monotonic()

    def notify(self, tenant: str, queue: str) -> None:
        """A push to (tenant, queue) committed (or its partitions became claimable): wake everyone
        waiting there, here and, through the sinks, on the peers."""
        self.wake(tenant, queue)
        for sink in self._sinks:
            sink(tenant, queue)

    def wake(self, tenant: str, queue: str) -> None:
        """Wake the pops of this process waiting on (tenant, queue)."""
        key = (tenant, queue)
        for g in self._by_queue.get(key, {}).values():
            g.epoch += 1  # whatever the group knew about the queue is stale
        for ev in self._subs.get(key, ()):
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

    def wake_after(self, tenant: str, queue: str, seconds: float) -> None:
        """Schedule a local :meth:`wake` of (tenant, queue) in ``seconds`` (rounded up to 100 ms;
        one timer per queue and 100 ms). Fires only if someone is parked there then."""
        loop = asyncio.get_running_loop()
        slot = int((loop.time() + max(seconds, 0.0)) * 10) + 1
        tkey = (tenant, queue, slot)
        if tkey in self._timers or len(self._timers) >= self._keep:
            return
        self._timers[tkey] = loop.call_at(slot / 10, self._fire, tkey)

    @property
    def scheduled(self) -> int:
        """Wakes scheduled and not fired yet (bounded like the probe groups), for metrics."""
        return len(self._timers)

    def _fire(self, tkey: tuple[str, str, int]) -> None:
        self._timers.pop(tkey, None)
        if (tkey[0], tkey[1]) in self._subs:
            self.wake(tkey[0], tkey[1])

    def close(self) -> None:
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    async def park(self, ev: asyncio.Event, seconds: float, tenant: str | None = None) -> bool:
        """Wait for ``ev`` up to ``seconds``; False when the time ran out. TooManyWaiters when this
        process, or ``tenant`` (with a per-tenant part), already has all the pops parked it may."""
        if ev.is_set() or self.draining:
            return True
        if self.parked >= self.limit:
            raise TooManyWaiters("too many parked long-poll pops on this broker")
        cap = self.tenant_limit
        counted = tenant if cap is not None else None  # the tenant whose part this pop takes
        if counted is not None and cap is not None and self._parked_by.get(counted, 0) >= cap:
            raise TooManyWaiters("too many parked long-poll pops for this tenant on this broker")
        self.parked += 1
        if counted is not None:
            self._parked_by[counted] = self._parked_by.get(counted, 0) + 1
        try:
            async with asyncio.timeout(seconds):
                await ev.wait()
            return True
        except TimeoutError:
            return False
        finally:
            self.parked -= 1
            if counted is not None:
                left = self._parked_by[counted] - 1
                if left:
                    self._parked_by[counted] = left
                else:
                    del self._parked_by[counted]
