"""Pop: claim and lease through ``queen.pop_v1``; long-poll without holding a connection.

A waiting pop parks on the queue's in-process event between attempts, holding no connection and no
permit (the caller's ``permit`` is held only around each claim, and taken again on wake). Wakes come
from pushes and from acks, nacks, transactions and lease give-backs that leave a partition claimable
(here, or from a peer through the mesh), from the jobs, and from the lease this process handed out
expiring (scheduled at its ``lease_expires_at``); the database re-check is the safety
net, shared by the pops parked on the same queue/group/partition and backed off from
``poll_interval`` to the waiters' ``poll_max`` (``queen_pg/engine/probes.py``). It stops
claiming a margin before the caller's deadline (250 ms at most, never more than a quarter of the
time left) so it never leases messages nobody will receive. For the same reason a pop whose client
went away (the route watches for the disconnect) claims nothing more, and a lease a claim took while
it happened is given back at once (``queen.lease_release_v1``). Shutdown (``Waiters.drain``) ends
every wait at once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime

from queen_pg.db.pool import Database, Record
from queen_pg.engine import calls, leases, pop_render, sealing
from queen_pg.engine.pop_frames import render_frames
from queen_pg.engine.pop_render import RenderedPop
from queen_pg.engine.pop_render import iso_ms as iso_ms  # re-exported: ack, dlq, messages use it
from queen_pg.engine.waiters import Waiters
from queen_pg.errors import NOT_FOUND, QueenError
from queen_pg.security import crypto

QUEUE_MODE = "__QUEUE_MODE__"
ANY_QUEUE = "\x00any"  # wake-up key of namespace/task pops: every push to the tenant wakes them
MAX_MARGIN_S = 0.25


def wire_group(group: str) -> str | None:
    """A stored group as the wire shows it (consumerGroup): None for queue mode (queen._group_out in SQL)."""
    return None if group == QUEUE_MODE else group


def group_label(group: str | None) -> str:
    """A stored group as an error detail names it."""
    return "queue mode (__QUEUE_MODE__)" if group == QUEUE_MODE else f"consumer group {group!r}"


def not_found(kind: str, queue: str | None, partition: str | None = None, group: str | None = None) -> QueenError:
    """The 404 for what a procedure answered missing: ``partition``, ``group`` or (anything else) the queue;
    a ``no_`` prefix (a status) reads the same."""
    kind = kind.removeprefix("no_")
    if kind == "partition":
        detail = f"partition {partition!r} not found in queue {queue!r}"
    elif kind == "group":
        on = f" does not exist on queue {queue!r}" if queue is not None else " not found"
        detail = group_label(group) + on
    else:
        detail = f"queue {queue!r} not found"
    return QueenError(NOT_FOUND, detail=detail)


@dataclass(frozen=True, slots=True)
class PopRequest:
    queue: str | None  # None: every queue tagged with namespace/task
    namespace: str | None
    task: str | None
    partition: str | None
    group: str | None
    batch: int
    partitions: int
    wait: bool
    timeout_ms: int
    auto_ack: bool
    subscription_mode: str | None
    subscription_from: datetime | None
    autopilot: bool
    lease_seconds: int | None = None  # None: the queue's leaseTime
    frames: bool = False  # answer QPF1 (docs/wire.md#framed-pop, queen_pg/engine/pop_frames.py) instead of JSON


Answer = RenderedPop  # the JSON answer, or the framed one (``frames``): its media_type says which


def render(
    tenant: str,
    req: PopRequest,
    lease_id: uuid.UUID,
    rows: list[Record],
    vault: crypto.Vault | None = None,
    db: object = None,
) -> RenderedPop | None:
    """Slice the claimed segments into the JSON pop answer (docs/wire.md#pop, rendered to bytes by
    ``pop_render.py``, decoded segments shared through ``db``'s segment cache); None when empty.
    Sealed payloads (an encrypted queue's) are opened with ``vault`` for ``tenant`` and the row's queue
    and partition (409 when it has no key for them, or they were sealed elsewhere)."""
    lease = None if req.auto_ack else str(lease_id)
    return pop_render.render(rows, lease, req.group, req.autopilot, pop_render.cache_of(db), vault, tenant=tenant)


def schedule_lease_wakes(waiters: Waiters, tenant: str, rows: list[Record]) -> None:
    """Wake this process's pops parked on a claimed queue when the lease expires (unless acked by
    then, the partition is claimable again at that moment)."""
    soonest: dict[str, datetime] = {}
    for row in rows:
        at = row["lease_expires_at"]
        if at is not None and (row["queue_name"] not in soonest or at < soonest[row["queue_name"]]):
            soonest[row["queue_name"]] = at
    if not soonest:
        return
    now = datetime.now(UTC)
    for queue, at in soonest.items():
        seconds = (at - now).total_seconds()
        waiters.wake_after(tenant, queue, seconds)
        waiters.wake_after(tenant, ANY_QUEUE, seconds)


async def schedule_visible_wake(db: Database, waiters: Waiters, tenant: str, req: PopRequest) -> None:
    """The queue looked empty to a pop: if pending messages are only held back by time (delayed,
    in a window buffer, leased by anyone), wake this process's pops parked on it at that moment
    (``queen.pop_next_at_v1``). A hint: a failed look costs latency up to the re-check."""
    assert req.queue is not None
    waiters.lookups += 1
    try:
        at = await db.fetchval(calls.POP_NEXT_AT, tenant, req.queue, req.group or QUEUE_MODE, req.partition)
    except QueenError:
        return
    if at is not None:
        waiters.wake_after(tenant, req.queue, (at - datetime.now(UTC)).total_seconds())


@dataclass(frozen=True, slots=True)
class Claim:
    """What one pop_v1 call leased, per partition: enough to give it back (:func:`release`)."""

    lease_id: uuid.UUID
    partition_ids: list[int]
    lease_starts: list[int]
    lease_ends: list[int]
    redelivered_ends: list[int]
    attempts: list[int]
    queues: frozenset[str] = frozenset()  # the queues of the claimed partitions (woken on release)


def claimed(lease_id: uuid.UUID, rows: list[Record]) -> Claim:
    """What the claim that returned ``rows`` leased, to give it back with :func:`release`."""
    seen: dict[int, Record] = {}
    for row in rows:
        seen.setdefault(row["partition_id"], row)
    firsts = sorted(seen.values(), key=lambda r: r["partition_id"])
    return Claim(
        lease_id,
        [r["partition_id"] for r in firsts],
        [r["lease_start"] for r in firsts],
        [r["lease_end"] for r in firsts],
        [r["redelivered_end"] for r in firsts],
        [r["attempts"] for r in firsts],
        frozenset(r["queue_name"] for r in firsts),
    )


@dataclass(frozen=True, slots=True)
class PopCall:
    """One pop's claim as a procedure call: the request and the lease id minted for it."""

    req: PopRequest
    lease_id: uuid.UUID


Fetch = Callable[[PopCall, bool], Awaitable[list[Record]]]  # (call, sealed) -> pop_v1's rows for it


async def fetch_alone(db: Database, tenant: str, call: PopCall, sealed: bool) -> list[Record]:
    """One pop's claim: one ``queen.pop_v1`` call (``sealed``: each segment's ``sealed`` too)."""
    req = call.req
    return await db.fetch(
        calls.POP_SEALED if sealed else calls.POP,
        tenant,
        req.queue,
        req.namespace,
        req.task,
        req.partition,
        req.group or QUEUE_MODE,
        req.batch,
        req.partitions,
        call.lease_id,
        req.auto_ack,
        req.subscription_mode,
        req.subscription_from,
        req.lease_seconds,
    )


async def pop_many(
    db: Database, tenant: str, queue: str, sealed: bool, requests: Sequence[Sequence[PopCall]]
) -> list[list[Record]]:
    """Several pops of one named queue, each of its own consumer group, in ONE ``queen.pop_many_v1``
    call (request fusion, queen_pg/engine/fusion.py); each request gets the rows ``pop_v1`` would have
    given it alone (same messages, leases, cursors: the procedure runs it for each member in turn). One
    request is one ``pop_v1`` call, as unfused."""
    members = [c for req in requests for c in req]
    if len(requests) == 1 and len(members) == 1:
        return [await fetch_alone(db, tenant, members[0], sealed)]
    assert len(members) == len(requests), "one claim per fused request"
    rows = await db.fetch(
        calls.POP_MANY_SEALED if sealed else calls.POP_MANY,
        tenant,
        queue,
        [c.req.partition for c in members],
        [c.req.group or QUEUE_MODE for c in members],
        [c.req.batch for c in members],
        [c.req.partitions for c in members],
        [c.lease_id for c in members],
        [c.req.auto_ack for c in members],
        [c.req.subscription_mode for c in members],
        [c.req.subscription_from for c in members],
        [c.req.lease_seconds for c in members],
    )
    out: list[list[Record]] = [[] for _ in members]
    for row in rows:
        out[row["member"] - 1].append(row)
    return out


async def _claim(
    db: Database, tenant: str, req: PopRequest, waiters: Waiters | None = None, fetch: Fetch | None = None
) -> tuple[Answer | None, Claim | None]:
    lease_id = uuid.uuid4()
    v = crypto.vault(db)
    call, sealed = PopCall(req, lease_id), req.frames and v.can_open
    rows = await (fetch(call, sealed) if fetch is not None else fetch_alone(db, tenant, call, sealed))
    if not rows:
        return None, None
    if waiters is not None and not req.auto_ack:
        schedule_lease_wakes(waiters, tenant, rows)
    if not req.auto_ack:
        leases.book_of(db).remember(lease_id, rows)  # its ack then needs no hash look-up
    got = None if req.auto_ack else claimed(lease_id, rows)
    try:
        if req.frames:
            lease = "" if req.auto_ack else str(lease_id)
            # a broker holding keys opens sealed segments (clients refuse flag-4 frames)
            shown, opened = sealing.opened_rows(v, tenant, rows)
            # a cut segment comes from the segment cache, which never holds opened plaintext
            cache = pop_render.NO_CACHE if opened else pop_render.cache_of(db)
            answer: Answer | None = render_frames(
                req.group is None, lease, req.group or "", req.autopilot, shown, cache
            )
        else:
            answer = render(tenant, req, lease_id, rows, v, db)
    except QueenError:  # a sealed payload this broker cannot open: the lease goes back, nothing is delivered
        if got is not None:
            await release(db, tenant, req, got, waiters)
        raise
    return answer, got


async def claim(
    db: Database, tenant: str, req: PopRequest, waiters: Waiters | None = None, fetch: Fetch | None = None
) -> Answer | None:
    return (await _claim(db, tenant, req, waiters, fetch))[0]


async def release(db: Database, tenant: str, req: PopRequest, got: Claim, waiters: Waiters | None = None) -> int:
    """Give back a lease whose answer will not be delivered (``queen.lease_release_v1``); its
    partitions hold messages again, so the pops parked on their queues are woken (``waiters``), here
    and over the mesh, as after a push."""
    released = await db.fetchval(
        calls.LEASE_RELEASE,
        tenant,
        req.group or QUEUE_MODE,
        got.lease_id,
        got.partition_ids,
        got.lease_starts,
        got.lease_ends,
        got.redelivered_ends,
        got.attempts,
    )
    if released and waiters is not None:
        for queue in got.queues:
            waiters.notify(tenant, queue)
        waiters.notify(tenant, ANY_QUEUE)
    return int(released or 0)


async def pop(
    db: Database,
    waiters: Waiters,
    tenant: str,
    req: PopRequest,
    poll_interval: float,
    clock: Callable[[], float] = time.monotonic,
    permit: Callable[[], AbstractAsyncContextManager[None]] = nullcontext,
    paused: Callable[[], bool] = lambda: False,
    wake: asyncio.Event | None = None,
    gone: Callable[[], bool] = lambda: False,
    fetch: Fetch | None = None,
) -> Answer | None:
    """Claim now, or (with wait) park until a push wakes us or the claim window closes. ``permit()``
    (the pop family's concurrency limiter) is held around each claim only, never while parked;
    ``paused()`` (pop maintenance) is asked before every claim, so a parked pop claims nothing once
    it turned on. ``gone()`` says the client went away (whoever knows sets ``wake`` too): no claim
    after it, and a claim made while it happened is released at once. Shutdown
    (``waiters.drain``) ends the wait: the pop answers what it has, or nothing. ``fetch`` makes the
    claim's procedure call instead of a ``pop_v1`` call of its own (the fuser's, which holds the
    family's permit around each call: pass no ``permit`` with it)."""
    timeout = max(req.timeout_ms, 0) / 1000.0
    stop_claiming = clock() + timeout - min(MAX_MARGIN_S, timeout / 4)
    wake_key = req.queue if req.queue is not None else ANY_QUEUE
    ev = waiters.subscribe(tenant, wake_key, wake) if req.wait else None
    scope = (req.group, req.partition, req.namespace, req.task) if req.queue is None else (req.group, req.partition)
    probe = waiters.probe(tenant, wake_key, *scope, poll_min=poll_interval, member=ev) if req.wait else None
    woken = False  # the last park ended with a wake (not the shared re-check's timer)
    try:
        while True:
            if paused() or gone():
                return None
            if ev is not None:
                ev.clear()  # set again by a push that commits from now on
            answer, got, probing = None, None, False
            action = probe.begin(clock(), ev) if probe is not None else "claim"
            if action is None:  # known empty and the group's re-check is not due: no database call
                waiters.skipped += 1
            else:
                probing = action == "probe"
                waiters.probes += probing
                gated = probe is not None and woken
                async with probe.gate if gated and probe is not None else nullcontext():
                    if (
                        gated
                        and probe is not None
                        and (clock() >= stop_claiming or (not probing and probe.known_empty()))
                    ):
                        waiters.skipped += 1  # a pop woken with us found it empty meanwhile (or too late)
                    elif not gone():
                        token = probe.epoch if probe is not None else 0
                        first_empty = False
                        try:
                            async with permit():
                                answer, got = await _claim(db, tenant, req, waiters, fetch)
                        finally:
                            if probe is not None:
                                first_empty = probe.end(token, answer is not None, probing, clock())
                        if first_empty and req.queue is not None:
                            await schedule_visible_wake(db, waiters, tenant, req)
            if gone():  # nobody to answer: the lease goes back at once instead of expiring
                if got is not None:
                    await release(db, tenant, req, got, waiters)
                return None
            if answer is not None or ev is None:
                if answer is not None and probing:  # found without a wake: the others may have work too
                    waiters.wake(tenant, wake_key)
                return answer
            left = stop_claiming - clock()
            if left <= 0 or waiters.draining:
                return None
            assert probe is not None
            woken = await waiters.park(ev, min(left, probe.park_for(clock(), ev)), tenant)
            if clock() >= stop_claiming or waiters.draining:
                return None
    finally:
        if ev is not None:
            waiters.release(tenant, wake_key, ev)
        if probe is not None:
            waiters.leave(probe, ev)
