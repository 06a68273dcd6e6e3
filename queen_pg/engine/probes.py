"""Shared probes: one database re-check for all the pops parked on the same thing.

A parked pop is woken by a push (this process's, or a mesh frame from another replica), by a
scheduled wake (a lease it handed out expires), or by the lease-expiry and timer jobs. Its own
database re-check is only the safety net for a wake that got lost. So the pops parked on the same
(tenant, queue, group, partition) share one :class:`Probe`: after a claim by any of them found
nothing, the group's state is "empty as of wake epoch E" (every wake of the queue bumps the epoch of
its groups) until ``due``; pops that start or wake
in that window skip the database entirely (they park at once), and at ``due`` exactly one of them
probes while the others keep waiting. Only that one, the group's *watcher*, has a timer at ``due``:
the others park until a wake or their own deadline (a probe that finds messages wakes the queue), so
a re-check costs one task switch, not one per parked pop. A watcher that leaves hands the role on by
setting another member's event. Pops woken together claim through the group's ``gate`` one at a
time, so once one found the queue empty again the others park without a claim. Each empty probe
doubles the delay (``poll_min`` up to ``poll_max``, jittered); a wake of the queue (a new
generation) starts it over.

Being wrong costs latency, never a message: ``due`` is never more than ``poll_max`` away.
"""

from __future__ import annotations

import asyncio
import math
import random

JITTER = 0.2


class Probe:
    __slots__ = (
        "busy",
        "delay",
        "due",
        "empty_epoch",
        "epoch",
        "gate",
        "members",
        "poll_max",
        "poll_min",
        "rng",
        "users",
        "watcher",
    )

    def __init__(self, poll_min: float, poll_max: float, rng: random.Random) -> None:
        self.poll_min = poll_min
        self.poll_max = max(poll_max, poll_min)
        self.rng = rng
        self.epoch = 0  # bumped by every wake of the queue (Waiters.wake)
        self.empty_epoch = -1  # the epoch in which a claim of the group found nothing; -1: unknown
        self.due = 0.0  # monotonic time of the next database probe
        self.delay = poll_min
        self.busy = False  # one member is probing right now
        self.users = 0
        # woken pops of the group claim one after the other: when the first finds nothing the rest
        # park again without a database call (one push, twenty parked pops: one or two claims, not 20)
        self.gate = asyncio.Lock()
        self.members: dict[asyncio.Event, None] = {}  # the parked pops' events, in arrival order
        self.watcher: asyncio.Event | None = None  # the member whose timer runs to ``due``

    def _jittered(self, delay: float) -> float:
        return delay * self.rng.uniform(1 - JITTER, 1 + JITTER)

    def known_empty(self) -> bool:
        """Nothing woke the queue since a claim of the group last found it empty."""
        return self.empty_epoch == self.epoch

    def join(self, member: asyncio.Event) -> None:
        self.members[member] = None

    def leave(self, member: asyncio.Event) -> None:
        """``member`` stops waiting; a leaving watcher wakes the next member, which takes the role (so
        does any member leaving while the role is vacant: the one woken may have left before parking)."""
        self.members.pop(member, None)
        if self.watcher is member or self.watcher is None:
            self.watcher = None
            if self.members:
                next(iter(self.members)).set()

    def begin(self, now: float, member: asyncio.Event | None = None) -> str | None:
        """What a pop about to claim should do: ``"claim"`` (something happened since the last empty
        look, or the group never looked), ``"probe"`` (the safety-net re-check is due and this pop makes
        it for the group), or None (skip the database and park)."""
        if not self.known_empty():
            return "claim"
        if self.busy or now < self.due:
            return None
        self.busy = True
        if member is not None:
            self.watcher = member  # the prober waits for the next ``due`` itself
        return "probe"

    def end(self, token: int, found: bool, probing: bool, now: float) -> bool:
        """A claim that started in epoch ``token`` found something or not. True when it was the first
        empty look since the group last learned anything (the caller asks when the queue's held-back
        messages become visible, once per wake)."""
        if probing:
            self.busy = False
        if found:  # messages came without a wake (lost frame, expired lease): look often again
            self.empty_epoch = -1
            self.delay = self.poll_min
            return False
        if token != self.epoch:  # woken while claiming: what it saw is already stale
            return False
        first = self.empty_epoch != token
        if first:  # the first empty look in this epoch
            self.empty_epoch = token
            self.delay = self.poll_min
        elif probing:
            self.delay = min(self.delay * 2, self.poll_max)
        else:
            return False
        self.due = now + self._jittered(self.delay)
        return first

    def park_for(self, now: float, member: asyncio.Event | None = None) -> float:
        """How long ``member`` may wait before it must look at the group again: until ``due`` for the
        watcher (the first to ask when there is none), forever for the others (the caller caps it with
        its deadline). Without ``member``: until ``due``."""
        if member is not None:
            if self.watcher is None:
                self.watcher = member
            if self.watcher is not member:
                return math.inf
        if self.busy:
            return 0.05  # a member is probing: see its verdict soon
        return max(self.due - now, 0.0)
