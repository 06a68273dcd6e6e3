"""Request fusion: concurrent pushes (and acks, and pops of different consumer groups) merged into ONE
stored-procedure call, results split back per request.

Each (family, tenant) has a :class:`Lane`. A request that finds fewer than ``inflight`` calls of its
lane running and nothing queued is sent at once, alone: under no concurrency fusion adds nothing.
Otherwise it joins the open batch, which is READY when its oldest member has waited ``hold_us`` or
it holds ``max_items``, and leaves when it is ready and fewer than ``max_calls`` calls of the lane run,
or when a running call returns (natural batching: the batch is whatever arrived during that call),
whichever comes first. ``hold_us = 0`` disables fusion.

Invariants:
- One fused call is exactly the requests run one after the other in arrival order (the engine's
  ``*_many`` functions split the results back, each request indexed from 0). Acks of requests that
  share a cursor row never share a call (``conflicts``), because ack_v1 charges retries per call.
  Pops fuse per (tenant, queue): the pops of DIFFERENT consumer groups that arrive together (a push
  wakes every group parked on its queue) become one ``queen.pop_many_v1`` call, each answered what
  ``pop_v1`` would have answered it alone. A group has at most one pop in its lane at a time; its
  other concurrent pops go alone at once (two pops of one group never share a call, and one busy
  group is never held to the lane's ``max_calls``). A pop whose request went away before its call left
  is not called for (``Lane.skip_gone``); one whose request went away while its fused call (or its
  retry alone) ran gets nothing, and the lease that call took for it is given back at once
  (``Lane.orphaned``). An autoAck pop's claim cannot be given back: one whose request went away while
  its fused call ran has its messages acked unseen (at-most-once), where an unfused pop's own
  cancelled statement is usually rolled back.
- Isolation: when a fused call fails, nothing of it was written (one statement, one transaction),
  so every member is retried ALONE and only the culprit gets the error. The exception: a
  ``db_unavailable`` failure (connection lost, timeout) may hide a commit, so it is passed to every
  member as is, like an unfused call would pass it to its one request.
- A fused call runs in a task of the lane, never in a request's task: a client that goes away cancels
  only its own wait, never its neighbours' call. :meth:`Fuser.close` awaits the running calls. A
  request that goes alone at once calls in its own task (nobody else depends on that call).
- The family's limiter (``queen_pg/limiter.py``) gates the CALLS, not the requests: each procedure
  call, fused or alone, holds one permit while it runs, and a request waits for its permit inside its
  batch. The limiter bounds what PostgreSQL sees (concurrent calls) and observes the calls' round trips;
  a permit per request would count a request's wait for its batch as database queueing, shrink the
  limit to its floor and so cap the batches (measured: 1-item pushes from 128 clients waited longer for
  a permit than for their call). A call refused by the limiter (429 ``overloaded``) wrote nothing and
  is answered to every member as is, never retried alone.
- At most ``max_calls`` calls of one lane run at once (the alone calls included): a ready batch that
  finds them all running waits, still gathering members, until one returns. Without the cap the hold
  timer launched a batch every ``hold_us`` while slow calls ran (measured: 16-18 push calls in flight
  per worker at peak), and concurrent ``push_v3`` calls of one queue wait on each other's partition
  rows ("Lock tuple") instead of sharing one bigger call. Two exceptions, both on rare paths: a fused
  call that failed retries its members alone side by side inside its own slot, and :meth:`Lane.close`
  (the broker stopping) sends every waiting batch at once.
- Lanes are per tenant (pop lanes per queue), so they are dropped once idle for ``lane_idle_s`` (swept
  when a lane is created, one pass at most every half ``lane_idle_s``): tenants and queues that come
  and go do not grow the map. A lane with a call running or a batch waiting is never idle.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar

from queen_pg.db.pool import Database, Record
from queen_pg.engine import ack as ack_engine
from queen_pg.engine import pop as pop_engine
from queen_pg.engine import push as push_engine
from queen_pg.engine import push_binary
from queen_pg.engine.binary import Group
from queen_pg.engine.outcomes import Once
from queen_pg.errors import DB_UNAVAILABLE, OVERLOADED, QueenError
from queen_pg.limiter import Limiter

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)  # what a lane is kept under (a tenant; a pop lane: tenant, queue, sealed)
R = TypeVar("R")  # one request's answer (push: push_engine.Answer, its bytes rendered once; ack: result dicts)
Result = Sequence[dict[str, Any]]  # ack: a list, or AckResults (rendered straight to bytes)
Call = Callable[[list[list[T]]], Awaitable[list[R]]]


@dataclass(frozen=True, slots=True)
class FuseConfig:
    hold_us: int = 2000  # longest wait for a batch to leave; 0 = no fusion
    max_items: int = 1000  # a batch leaves at once when it holds this many items
    inflight: int = 1  # calls of one lane running before new requests queue (natural batching)
    max_calls: int = 2  # calls of one lane running at most; a ready batch waits for one to return
    lane_idle_s: float = 60.0  # a lane idle this long is dropped (swept when a lane is created)
    pops: bool = True  # pops of different consumer groups on one queue fuse (QUEEN_FUSE_POPS); off: alone


@dataclass(slots=True, eq=False)  # compared by identity
class _Member(Generic[T, R]):
    items: list[T]
    keys: frozenset[Hashable]
    future: asyncio.Future[R]


@dataclass(slots=True, eq=False)  # compared by identity (``batch in pending``)
class _Batch(Generic[T, R]):
    members: list[_Member[T, R]] = field(default_factory=list)
    items: int = 0
    keys: set[Hashable] = field(default_factory=set)
    timer: asyncio.TimerHandle | None = None


@dataclass(slots=True)
class LaneStats:
    calls: int = 0  # procedure calls made (fused or alone)
    requests: int = 0  # requests answered through those calls
    isolated: int = 0  # fused calls that failed and were retried member by member


class Lane(Generic[T, R]):
    """The batcher of one family and tenant. ``call`` makes ONE procedure call for a list of
    requests and returns one result list per request."""

    def __init__(
        self, name: str, call: Call[T, R], config: FuseConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        self.clock = clock
        self.call = call
        self.config = config
        self.stats = LaneStats()
        self.running = 0
        self._pending: deque[_Batch[T, R]] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self.idle_since: float | None = clock()  # when it last became idle (created idle); None = busy
        # called with a member's items and result when its request went away before the fused call (or
        # its retry alone) returned (a pop gives its lease back); None: the result is dropped
        self.orphaned: Callable[[list[T], R], None] | None = None
        # a member whose request went away before its call left is not called (a pop claims nothing for
        # nobody: under autoAck the claim is the delivery); False: it is called all the same (a push
        # is written, as it came)
        self.skip_gone = False

    @property
    def queued(self) -> int:
        """Requests waiting in batches that have not left yet."""
        return sum(len(b.members) for b in self._pending)

    @property
    def ready(self) -> int:
        """Requests in batches that could leave (hold over, or full) but wait for a call slot."""
        return sum(len(b.members) for b in self._pending if b.timer is None or b.items >= self.config.max_items)

    def idle_for(self, now: float) -> float:
        """Seconds this lane has had nothing running and nothing waiting (0 while busy)."""
        if self.running or self._pending or self._tasks or self.idle_since is None:
            return 0.0
        return now - self.idle_since

    async def submit(self, items: list[T], keys: frozenset[Hashable] = frozenset()) -> R:
        self.idle_since = None
        if not self._pending and self.running < min(self.config.inflight, self.config.max_calls):
            return await self._alone_now(items)
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        member = _Member(items, keys, future)
        self._join(member)
        return await member.future

    async def _alone_now(self, items: list[T]) -> R:
        """Nothing queued and a call slot free: call at once, in the request's own task (no added
        latency, and a request that goes away cancels only its own call)."""
        self.running += 1
        self.stats.calls += 1
        self.stats.requests += 1
        try:
            (res,) = await self.call([items])
            return res
        finally:
            self._done()

    def _join(self, member: _Member[T, R]) -> None:
        for batch in self._pending:
            if batch.items + len(member.items) <= self.config.max_items and batch.keys.isdisjoint(member.keys):
                break
        else:
            batch = _Batch[T, R]()
            batch.timer = asyncio.get_running_loop().call_later(self.config.hold_us / 1e6, self._expire, batch)
            self._pending.append(batch)
        batch.members.append(member)
        batch.items += len(member.items)
        batch.keys.update(member.keys)
        if batch.items >= self.config.max_items and self.running < self.config.max_calls:
            self._start(batch)

    def _expire(self, batch: _Batch[T, R]) -> None:
        """The batch's hold is over: it leaves, unless the lane already runs ``max_calls`` calls; then
        it waits for one of them to return (:meth:`_done`), gathering whoever comes meanwhile."""
        batch.timer = None
        if batch in self._pending and self.running < self.config.max_calls:
            self._start(batch)

    def _start(self, batch: _Batch[T, R]) -> None:
        if batch.timer is not None:
            batch.timer.cancel()
        if batch in self._pending:
            self._pending.remove(batch)
        self.running += 1
        task = asyncio.get_running_loop().create_task(self._run(batch.members))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, members: list[_Member[T, R]]) -> None:
        try:
            if self.skip_gone:
                members = [m for m in members if not m.future.done()]
                if not members:
                    return
            self.stats.calls += 1
            self.stats.requests += len(members)
            try:
                results = await self.call([m.items for m in members])
            except Exception as exc:
                if len(members) == 1 or _shared_fate(exc):
                    for m in members:
                        _settle(m, exc=exc)
                    return
                self.stats.isolated += 1
                await asyncio.gather(*(self._alone(m) for m in members))
                return
            for m, res in zip(members, results, strict=True):
                self._answer(m, res)
        except asyncio.CancelledError:
            for m in members:
                _settle(m, exc=QueenError(DB_UNAVAILABLE, detail="the broker is stopping"))
            raise
        finally:
            self._done()

    def _done(self) -> None:
        """A call returned: the oldest waiting batch leaves now (natural batching), if the lane runs
        fewer than ``inflight`` calls, or if that batch is ready (full, or its hold is over) and the
        lane runs fewer than ``max_calls``."""
        self.running -= 1
        if self._pending and self.running < self.config.max_calls:
            oldest = self._pending[0]
            if self.running < self.config.inflight or oldest.timer is None or oldest.items >= self.config.max_items:
                self._start(oldest)
        elif not self.running and not self._pending:
            self.idle_since = self.clock()

    def _answer(self, member: _Member[T, R], res: R) -> None:
        """A call's result for ``member``: to its request, or to ``orphaned`` when the request went away."""
        if member.future.done() and self.orphaned is not None:
            self.orphaned(member.items, res)
        _settle(member, res)

    async def _alone(self, member: _Member[T, R]) -> None:
        if self.skip_gone and member.future.done():
            return
        self.stats.calls += 1
        try:
            (res,) = await self.call([member.items])
        except Exception as exc:
            _settle(member, exc=exc)
        else:
            self._answer(member, res)

    async def close(self) -> None:
        for batch in list(self._pending):
            self._start(batch)
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _shared_fate(exc: BaseException) -> bool:
    """Failures that say nothing about one member: never retried alone. ``db_unavailable`` may hide a
    commit; ``overloaded`` (the call's limiter permit was refused) wrote nothing, and retrying each
    member alone would only ask the saturated limiter once per member."""
    return isinstance(exc, QueenError) and exc.kind in (DB_UNAVAILABLE, OVERLOADED)


def _settle(member: _Member[Any, R], res: R | None = None, exc: BaseException | None = None) -> None:
    if member.future.done():  # its request went away
        return
    if exc is not None:
        member.future.set_exception(exc)
    elif res is not None:
        member.future.set_result(res)


class Fuser:
    """The lanes of one broker process: ``push`` (JSON, and binary stored as it came), ``ack`` and ``pop``
    fuse, everything else calls directly.
    With ``limiters`` (family -> its limiter) every procedure call of a family, fused or not, holds
    one permit of it: the caller takes no permit of its own around :meth:`push` and :meth:`ack`."""

    def __init__(
        self,
        db: Database,
        config: FuseConfig,
        clock: Callable[[], float] = time.monotonic,
        limiters: Mapping[str, Limiter] | None = None,
    ) -> None:
        self.db = db
        self.config = config
        self.clock = clock
        self.limiters: Mapping[str, Limiter] = limiters or {}
        self._push: dict[str, Lane[push_engine.NewMessage, push_engine.Answer]] = {}
        self._push_binary: dict[str, Lane[Group, push_engine.Answer]] = {}
        self._ack: dict[str, Lane[ack_engine.AckLike, ack_engine.AckResults]] = {}
        self._pop: dict[tuple[str, str, bool], Lane[pop_engine.PopCall, list[Record]]] = {}
        self._pop_groups: set[tuple[str, str, bool, str]] = set()  # the groups with a pop in a pop lane
        self._releases: set[asyncio.Task[int]] = set()  # leases of pops that went away, given back
        self.dropped = 0  # idle lanes dropped so far
        self.sweeps = 0  # passes over the lanes so far
        self._next_sweep = clock()  # no pass before then

    def sweep(self) -> None:
        """Drop the lanes idle for ``lane_idle_s`` or longer: one pass over them at most every half
        ``lane_idle_s`` (pop lanes are per queue: a pass on every new lane cost in proportion to the queues)."""
        now = self.clock()
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.config.lane_idle_s / 2
        self.sweeps += 1
        every: list[dict[Any, Lane[Any, Any]]] = [self._push, self._push_binary, self._ack, self._pop]
        for lanes in every:
            for key in [k for k, lane in lanes.items() if lane.idle_for(now) >= self.config.lane_idle_s]:
                del lanes[key]
                self.dropped += 1

    @property
    def enabled(self) -> bool:
        return self.config.hold_us > 0

    def permit(self, family: str) -> AbstractAsyncContextManager[None]:
        """One permit of the family's limiter around one procedure call (none without a limiter)."""
        limiter = self.limiters.get(family)
        return limiter.acquire() if limiter is not None else nullcontext()

    def _lane(
        self,
        lanes: dict[K, Lane[T, R]],
        key: K,
        name: str,
        family: str,
        many: Callable[..., Awaitable[list[R]]],
        *args: Any,
    ) -> tuple[Lane[T, R], bool]:
        """The lane under ``key`` (and whether it is new); a new one's call is ``many(db, *args, requests)``,
        one procedure call under one permit of ``family``'s limiter, and it first sweeps the idle lanes."""
        lane = lanes.get(key)
        if lane is not None:
            return lane, False
        self.sweep()
        fused = partial(many, self.db, *args)

        async def call(requests: list[list[T]]) -> list[R]:
            async with self.permit(family):
                return await fused(requests)

        lane = lanes[key] = Lane(name, call, self.config, self.clock)
        return lane, True

    def push_lane(self, tenant: str) -> Lane[push_engine.NewMessage, push_engine.Answer]:
        return self._lane(self._push, tenant, "push", "push", push_engine.push_many, tenant)[0]

    def push_binary_lane(self, tenant: str) -> Lane[Group, push_engine.Answer]:
        """Stored-as-is binary pushes (engine/push_binary.py): concurrent bodies share one ``push_v3``
        call when they name different partitions (a call appends one segment per partition)."""
        return self._lane(self._push_binary, tenant, "push-binary", "push", push_binary.push_many, tenant)[0]

    def ack_lane(self, tenant: str) -> Lane[ack_engine.AckLike, ack_engine.AckResults]:
        return self._lane(self._ack, tenant, "ack", "ack", ack_engine.ack_many, tenant)[0]

    def pop_lane(self, tenant: str, queue: str, sealed: bool) -> Lane[pop_engine.PopCall, list[Record]]:
        key = (tenant, queue, sealed)
        lane, new = self._lane(self._pop, key, "pop", "pop", pop_engine.pop_many, tenant, queue, sealed)
        if new:

            def orphaned(calls: list[pop_engine.PopCall], rows: list[Record]) -> None:
                """A pop that went away while its fused call ran: its lease goes back at once."""
                (c,) = calls
                if rows and not c.req.auto_ack:
                    got = pop_engine.claimed(c.lease_id, rows)
                    task = asyncio.get_running_loop().create_task(pop_engine.release(self.db, tenant, c.req, got))
                    self._releases.add(task)
                    task.add_done_callback(self._releases.discard)

            lane.orphaned = orphaned
            lane.skip_gone = True
        return lane

    async def pop(self, tenant: str, call: pop_engine.PopCall, sealed: bool) -> list[Record]:
        """``pop_engine.fetch_alone`` (one pop's claim), fused with concurrent pops of OTHER consumer groups
        on the same queue; a pop across queues (namespace/task), or one whose group already has a pop
        in the lane, calls alone at once; so does every pop with pop fusion off (``FuseConfig.pops``)."""
        queue = call.req.queue
        group = call.req.group or pop_engine.QUEUE_MODE
        mine = (tenant, queue or "", sealed, group)
        if not self.enabled or not self.config.pops or queue is None or mine in self._pop_groups:
            async with self.permit("pop"):
                return await pop_engine.fetch_alone(self.db, tenant, call, sealed)
        self._pop_groups.add(mine)
        try:
            return await self.pop_lane(tenant, queue, sealed).submit([call], frozenset((group,)))
        finally:
            self._pop_groups.discard(mine)

    async def push(
        self, tenant: str, items: list[push_engine.NewMessage], once: Once | None = None
    ) -> push_engine.Answer:
        """``push_engine.push``, fused with concurrent pushes of the tenant; a keyed request (``once``,
        the outcome window) is never fused."""
        if once is not None or not self.enabled or len(items) >= self.config.max_items:
            async with self.permit("push"):
                return await push_engine.push(self.db, tenant, items, once)
        return await self.push_lane(tenant).submit(items)

    async def push_stored(self, tenant: str, groups: list[Group], once: Once | None = None) -> push_engine.Answer:
        """``push_binary.push`` (flag-8 groups stored as they came), fused with concurrent ones of the
        tenant naming other partitions; a keyed request (``once``) is never fused."""
        if once is not None or not self.enabled:
            async with self.permit("push"):
                return await push_binary.push(self.db, tenant, groups, once)
        return await self.push_binary_lane(tenant).submit(groups, frozenset((g.queue, g.partition) for g in groups))

    async def ack(self, tenant: str, items: list[ack_engine.AckLike], once: Once | None = None) -> Result:
        """``ack_engine.ack``, fused with concurrent acks of the tenant on other cursor rows; a keyed
        request (``once``) is never fused."""
        if once is not None or not self.enabled or len(items) >= self.config.max_items:
            async with self.permit("ack"):
                return await ack_engine.ack(self.db, tenant, items, once)
        return await self.ack_lane(tenant).submit(items, ack_engine.cursor_keys(items))

    def lanes(self) -> list[Lane[Any, Any]]:
        return [*self._push.values(), *self._push_binary.values(), *self._ack.values(), *self._pop.values()]

    async def close(self) -> None:
        for lane in self.lanes():
            await lane.close()
        while self._releases:
            await asyncio.gather(*self._releases, return_exceptions=True)
