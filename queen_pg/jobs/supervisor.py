"""The job shape, the job loop, and the supervisor that owns every background task.

A :class:`Job` is a small config (name, idle interval, batch limit) and a ``run_once`` that makes one
bounded stored-procedure call and returns how much it did. :func:`run_job` repeats ``run_once`` at
once while the batch came back full (:meth:`Job.more`), otherwise sleeps the interval with jitter;
an error is logged (``event=job_error``) and survived with jittered exponential backoff.

The :class:`Supervisor` starts named asyncio tasks, logs a crash and restarts the task with backoff
(or, for a task marked critical, calls ``on_fatal``, by default SIGTERM to this process, which
uvicorn turns into a clean shutdown), and on :meth:`Supervisor.stop` cancels and awaits them all.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from queen_pg.db.pool import Database

log = logging.getLogger("queen_pg.jobs")

MAX_BACKOFF_S = 60.0
JITTER = 0.2  # sleeps are drawn from [1 - JITTER, 1 + JITTER] x the nominal delay


@dataclass(frozen=True, slots=True)
class JobConfig:
    name: str
    interval: float  # seconds between ticks when there is nothing (more) to do
    limit: int  # most items one run_once handles


class Job(ABC):
    """A background job: one bounded procedure call per :meth:`run_once`."""

    def __init__(self, config: JobConfig) -> None:
        self.config = config
        self.runs = 0  # ticks completed, failed ticks and items done, for metrics (queen_pg/metrics.py)
        self.errors = 0
        self.items = 0

    @property
    def name(self) -> str:
        return self.config.name

    @abstractmethod
    async def run_once(self, db: Database, now: datetime | None = None) -> int:
        """Make one bounded procedure call; return how much it did (0 = nothing, or not the leader)."""

    def idle_delay(self) -> float:
        """Seconds to sleep after a tick that drained the backlog (the interval unless a job says more)."""
        return self.config.interval

    def more(self, done: int) -> bool:
        """Whether to call :meth:`run_once` again at once: the batch came back full."""
        return done >= self.config.limit

    async def tick(self, db: Database, now: datetime | None = None) -> int:
        """``run_once`` until :meth:`more` says the backlog is drained; the total done."""
        total = 0
        while True:
            done = await self.run_once(db, now)
            total += done
            if not self.more(done):
                return total


class Prune(Job):
    """A job that deletes what nothing reads any more: one call of ``sql`` with (``limit``, the
    :meth:`args` between, ``now``) returns how many ``unit`` it deleted (0 when another replica holds the
    job's lock), logged as ``event=job_done``."""

    sql: ClassVar[str]
    default: ClassVar[JobConfig]
    unit: ClassVar[str] = "rows"

    def __init__(self, config: JobConfig | None = None) -> None:
        super().__init__(config or self.default)

    def args(self) -> tuple[object, ...]:
        return ()

    async def run_once(self, db: Database, now: datetime | None = None) -> int:
        deleted = int(await db.fetchval(self.sql, self.config.limit, *self.args(), now) or 0)
        if deleted:
            log.info("event=job_done job=%s %s=%d", self.name, self.unit, deleted)
        return deleted


def _jittered(delay: float, rng: random.Random) -> float:
    return delay * rng.uniform(1 - JITTER, 1 + JITTER)


def backoff(failures: int, interval: float) -> float:
    """Nominal delay after ``failures`` consecutive errors: the interval, doubled per failure, capped."""
    return float(min(interval * 2 ** min(failures - 1, 16), max(interval, MAX_BACKOFF_S)))


async def run_job(job: Job, db: Database, rng: random.Random | None = None) -> None:
    """The loop of one job, until cancelled. The first tick comes after a random part of the
    interval, so replicas that boot together do not tick together."""
    rng = rng or random.Random()
    interval = job.config.interval
    await asyncio.sleep(rng.uniform(0, interval))
    failures = 0
    while True:
        try:
            job.items += await job.tick(db)
            job.runs += 1
        except Exception as exc:  # survived: the database may be restarting
            job.errors += 1
            failures += 1
            delay = backoff(failures, interval)
            log.warning(
                "event=job_error job=%s failures=%d retry_in_s=%.1f error=%s: %s",
                job.name,
                failures,
                delay,
                exc.__class__.__name__,
                exc,
            )
        else:
            if failures:
                log.info("event=job_recovered job=%s after_failures=%d", job.name, failures)
            failures = 0
            delay = job.idle_delay()
        await asyncio.sleep(_jittered(delay, rng))


def stop_process(name: str) -> None:
    """Default ``on_fatal``: SIGTERM to this process; uvicorn shuts down cleanly (lifespan exit)."""
    os.kill(os.getpid(), signal.SIGTERM)


@dataclass(slots=True)
class _Spec:
    name: str
    factory: Callable[[], Awaitable[None]]
    critical: bool
    task: asyncio.Task[None] | None = None
    restarts: int = 0


class Supervisor:
    """Owns the broker's background tasks: named, bounded in number, restarted, stopped cleanly."""

    def __init__(
        self,
        on_fatal: Callable[[str], None] = stop_process,
        restart_delay: float = 1.0,
        max_restart_delay: float = MAX_BACKOFF_S,
        max_tasks: int = 64,
        stop_timeout: float = 10.0,
    ) -> None:
        self._on_fatal = on_fatal
        self._restart_delay = restart_delay
        self._max_restart_delay = max_restart_delay
        self._max_tasks = max_tasks
        self._stop_timeout = stop_timeout
        self._specs: dict[str, _Spec] = {}
        self.jobs: dict[str, Job] = {}  # the jobs started with start_job, by name (read by metrics)
        self._stopping = False

    @property
    def names(self) -> list[str]:
        return list(self._specs)

    def task(self, name: str) -> asyncio.Task[None] | None:
        return self._specs[name].task

    def restarts(self, name: str) -> int:
        return self._specs[name].restarts

    def start(self, name: str, factory: Callable[[], Awaitable[None]], *, critical: bool = False) -> None:
        """Run ``factory()`` as task ``name`` under supervision; names are unique."""
        if self._stopping:
            raise RuntimeError("supervisor is stopping")
        if name in self._specs:
            raise ValueError(f"a task named {name!r} is already supervised")
        if len(self._specs) >= self._max_tasks:
            raise RuntimeError(f"supervisor limit of {self._max_tasks} tasks reached")
        spec = _Spec(name, factory, critical)
        self._specs[name] = spec
        spec.task = asyncio.create_task(self._supervise(spec), name=f"queen:{name}")
        log.info("event=task_started task=%s critical=%s", name, critical)

    def start_job(self, job: Job, db: Database, *, critical: bool = False) -> None:
        self.start(job.name, lambda: run_job(job, db), critical=critical)
        self.jobs[job.name] = job

    async def _supervise(self, spec: _Spec) -> None:
        delay = self._restart_delay
        while True:
            started = time.monotonic()
            try:
                await spec.factory()
            except Exception:
                if spec.critical:
                    log.critical(
                        "event=task_crashed task=%s critical=True action=stop_process", spec.name, exc_info=True
                    )
                    self._on_fatal(spec.name)
                    return
                if time.monotonic() - started > self._max_restart_delay:
                    delay = self._restart_delay  # it ran fine for a while: start the backoff over
                spec.restarts += 1
                log.error(
                    "event=task_crashed task=%s critical=False restarts=%d restart_in_s=%.1f",
                    spec.name,
                    spec.restarts,
                    delay,
                    exc_info=True,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._max_restart_delay)
            else:
                log.info("event=task_finished task=%s", spec.name)
                return

    async def stop(self) -> None:
        """Cancel every task and wait for them (at most ``stop_timeout`` seconds)."""
        self._stopping = True
        tasks = [s.task for s in self._specs.values() if s.task is not None and not s.task.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self._stop_timeout)
            for t in pending:
                log.warning("event=task_stop_timeout task=%s", t.get_name())
        log.info("event=supervisor_stopped tasks=%d", len(tasks))
