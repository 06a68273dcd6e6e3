"""Overload control in memory: a fair weighted semaphore, and the Vegas concurrency limiter built on it.

* :func:`tenant_part`: one tenant's part of a shared pool, so one tenant cannot starve the others.
* :class:`FairSemaphore` grants permits of any weight strictly first come, first served, up to an
  adjustable ``capacity``, with a bounded number of waiters. The admission byte budget
  (``queen_pg/api/shared/admission.py``) is one; each :class:`Limiter` holds one of weight-1 permits.
* :class:`Limiter` is a Vegas-style controller per route family (``push``, ``pop``, ``ack``,
  ``transaction``, ``kv``). It watches how long each permit is held (the engine call: one
  PostgreSQL round trip, including the wait for a pooled connection), keeps a windowed minimum
  (``rtt_min``: the unloaded latency) and a smoothed recent value (``rtt``), estimates the requests
  queued inside the database as ``limit × (1 − rtt_min / rtt)``, and moves the limit by
  ``max(1, log10(limit))``: up when that queue is below ``alpha`` (and the limit is actually used),
  down when it is above ``beta``, clamped to ``[min_limit, max_limit]``.

Nothing here is durable or decides data: losing it costs latency or a 429, never a message. The
clock is injected so tests move time instead of sleeping. Does not import FastAPI.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from queen_pg.errors import OVERLOADED, QueenError, Verdict

log = logging.getLogger("queen_pg.limiter")

FAMILIES = ("push", "pop", "ack", "transaction", "kv")
RETRY_AFTER_S = (1, 5)  # a 429 tells the client to come back within this many seconds (random, integer)


def retry_after(rng: random.Random | None = None) -> int:
    """Seconds for ``Retry-After``: random in [1, 5], so refused clients do not return in step."""
    return (rng or random).randint(*RETRY_AFTER_S)


def tenant_part(capacity: int, share: float, at_least: int = 1) -> int | None:
    """A tenant's part of a pool its tenants share (the admission byte budget, the parked long-poll
    pops): ``share`` of ``capacity``, at least ``at_least`` (one largest request). None: no per-tenant
    part (``share`` >= 1, as when tenancy is off)."""
    if share >= 1:
        return None
    return max(int(capacity * share), at_least)


class QueueFull(Exception):
    """More callers are already waiting than the semaphore admits."""


class FairSemaphore:
    """Weighted permits up to ``capacity``, granted in arrival order (a big request is never starved
    by small ones overtaking it). A permit heavier than the capacity is granted when nothing else is
    held, so it cannot wait forever. ``capacity`` may change; call :meth:`grant` after raising it."""

    def __init__(self, capacity: int, max_waiters: int) -> None:
        self.capacity = capacity
        self.max_waiters = max_waiters
        self.used = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def _fits(self, weight: int) -> bool:
        return self.used + weight <= self.capacity or self.used == 0

    def try_acquire(self, weight: int) -> bool:
        """Take ``weight`` at once if nobody is waiting and it fits."""
        if not self._waiters and self._fits(weight):
            self.used += weight
            return True
        return False

    async def acquire(self, weight: int, within: float) -> None:
        """Take ``weight``, waiting in line up to ``within`` seconds (``TimeoutError``); ``QueueFull``
        when ``max_waiters`` callers already wait."""
        if self.try_acquire(weight):
            return
        if len(self._waiters) >= self.max_waiters:
            raise QueueFull
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (weight, fut)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(within):
                await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release(weight)  # granted just as we gave up: hand it on
            else:
                fut.cancel()
                try:
                    self._waiters.remove(entry)
                except ValueError:
                    pass
                self.grant()  # a big waiter leaving may let smaller ones behind it in
            raise

    def release(self, weight: int) -> None:
        self.used -= weight
        self.grant()

    def grant(self) -> None:
        """Hand permits to the waiters at the head of the line while they fit."""
        while self._waiters:
            weight, fut = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            if not self._fits(weight):
                return
            self._waiters.popleft()
            self.used += weight
            fut.set_result(None)


class OverloadLog:
    """``event=overloaded`` once when refusals start and ``event=overload_cleared`` once when a caller
    gets in without waiting again: one line per transition, never one per request."""

    def __init__(self, family: str, stage: str) -> None:
        self.family = family
        self.stage = stage
        self.active = False
        self.rejected = 0  # refusals since the last transition
        self.total = 0  # refusals since start

    def refused(self, **fields: Any) -> None:
        self.rejected += 1
        self.total += 1
        if not self.active:
            self.active = True
            extra = " ".join(f"{k}={v}" for k, v in fields.items())
            log.warning("event=overloaded family=%s stage=%s %s", self.family, self.stage, extra)

    def admitted(self) -> None:
        if self.active:
            self.active = False
            log.info("event=overload_cleared family=%s stage=%s refused=%d", self.family, self.stage, self.rejected)
            self.rejected = 0


@dataclass(frozen=True, slots=True)
class LimiterConfig:
    initial: int = 20
    min_limit: int = 4
    max_limit: int = 1000
    max_queue: int = 10_000  # callers waiting for a permit, per family
    max_wait_s: float = 15.0  # a caller waits this long (jittered) before it is refused with 429
    jitter: float = 0.2  # the wait is drawn from [1 - jitter, 1 + jitter] x max_wait_s
    smoothing: float = 0.2  # weight of a new sample in the smoothed rtt
    rtt_min_window_s: float = 30.0  # rtt_min is the minimum over the last one to two windows
    alpha: float = 3.0  # grow while the estimated queue is below alpha x step
    beta: float = 6.0  # shrink while it is above beta x step


class Limiter:
    """The Vegas concurrency limiter of one route family."""

    def __init__(
        self,
        family: str,
        config: LimiterConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.family = family
        self.config = cfg = config or LimiterConfig()
        self._clock = clock
        self._rng = rng or random.Random()
        self._limit = float(min(max(cfg.initial, cfg.min_limit), cfg.max_limit))
        self._sem = FairSemaphore(int(self._limit), cfg.max_queue)
        self._window_start = clock()
        self._min_prev = math.inf  # minimum of the previous window
        self._min_cur = math.inf  # minimum of the current window
        self._rtt = 0.0  # smoothed; 0 until the first sample
        self._log = OverloadLog(family, "limiter")

    @property
    def limit(self) -> int:
        return self._sem.capacity

    @property
    def in_flight(self) -> int:
        return self._sem.used

    @property
    def queued(self) -> int:
        return self._sem.queued

    @property
    def rtt_min(self) -> float:
        """Windowed minimum of the observed round-trip times (seconds); inf before the first one."""
        return min(self._min_prev, self._min_cur)

    @property
    def rtt(self) -> float:
        """Smoothed recent round-trip time (seconds); 0 before the first one."""
        return self._rtt

    def observe(self, rtt: float, in_flight: int | None = None) -> None:
        """Feed one round-trip time (seconds) and move the limit. ``in_flight`` is the concurrency the
        sample was taken at (default: now); the limit grows only when at least half of it was used."""
        if not rtt > 0:
            return
        cfg = self.config
        now = self._clock()
        elapsed = now - self._window_start
        if elapsed >= cfg.rtt_min_window_s:
            self._min_prev = self._min_cur if elapsed < 2 * cfg.rtt_min_window_s else math.inf
            self._min_cur = math.inf
            self._window_start = now
        self._min_cur = min(self._min_cur, rtt)
        self._rtt = rtt if self._rtt == 0 else self._rtt + cfg.smoothing * (rtt - self._rtt)
        limit = self._limit
        queue = limit * (1 - self.rtt_min / max(self._rtt, self.rtt_min))
        step = max(1.0, math.log10(limit))
        used = self.in_flight if in_flight is None else in_flight
        if queue > cfg.beta * step:
            limit -= step
        elif queue < cfg.alpha * step and used * 2 >= limit:
            limit += step
        self._limit = min(max(limit, float(cfg.min_limit)), float(cfg.max_limit))
        before = self._sem.capacity
        self._sem.capacity = max(1, int(self._limit))
        if self._sem.capacity > before:
            self._sem.grant()

    def acquire(self) -> _Permit:
        """Hold one permit of this family around one engine call (``async with``). Waits in line up to
        ``max_wait_s`` (jittered); refused with 429 ``overloaded`` when the wait runs out or the line is
        full. The time the permit was held is the sample fed to :meth:`observe` (not on 5xx or
        cancellation: an unavailable database says nothing about its queue). A plain class, not a
        generator-based context manager: it is on every data-plane call."""
        return _Permit(self)

    async def _enter(self) -> tuple[int, float]:
        """Take a permit; (permits held then, start time) for the sample."""
        if self._sem.try_acquire(1):
            self._log.admitted()
        else:
            cfg = self.config
            wait = cfg.max_wait_s * self._rng.uniform(1 - cfg.jitter, 1 + cfg.jitter)
            try:
                await self._sem.acquire(1, wait)
            except (TimeoutError, QueueFull) as exc:
                why = "queue_full" if isinstance(exc, QueueFull) else "wait_expired"
                self._log.refused(
                    reason=why, limit=self.limit, in_flight=self.in_flight, queued=self.queued, wait_s=f"{wait:.2f}"
                )
                raise QueenError(
                    OVERLOADED,
                    detail=f"the broker is overloaded ({self.family}: {why}); retry later",
                    retry_after=retry_after(self._rng),
                ) from None
        return self.in_flight, self._clock()

    def _exit(self, in_flight: int, start: float, exc: BaseException | None) -> None:
        # a decided refusal (Verdict) is a full round trip; a 5xx or a cancellation says nothing
        if exc is None or isinstance(exc, Verdict) or (isinstance(exc, QueenError) and exc.status < 500):
            self.observe(self._clock() - start, in_flight)
        self._sem.release(1)

    def snapshot(self) -> dict[str, float]:
        """For /metrics: current limit, permits held, callers waiting, rtt_min and rtt (seconds), and
        the callers refused since start."""
        rtt_min = self.rtt_min
        return {
            "limit": float(self.limit),
            "in_flight": float(self.in_flight),
            "queued": float(self.queued),
            "rtt_min_seconds": 0.0 if math.isinf(rtt_min) else rtt_min,
            "rtt_seconds": self._rtt,
            "rejected_total": float(self._log.total),
        }


class _Permit:
    """``async with limiter.acquire():`` one permit, given back on the way out."""

    __slots__ = ("in_flight", "limiter", "start")

    def __init__(self, limiter: Limiter) -> None:
        self.limiter = limiter
        self.in_flight = 0
        self.start = 0.0

    async def __aenter__(self) -> None:
        self.in_flight, self.start = await self.limiter._enter()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        self.limiter._exit(self.in_flight, self.start, exc)


def build_limiters(config: LimiterConfig) -> dict[str, Limiter]:
    """One limiter per route family, each with its own limit and line."""
    return {family: Limiter(family, config) for family in FAMILIES}
