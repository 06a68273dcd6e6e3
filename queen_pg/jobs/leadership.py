"""Leadership: one process (of all the replicas and workers on a database) ticks the jobs at their pace.

A job whose procedure elects a leader per tick (``pg_try_advisory_xact_lock``, docs/locks.md) is
correct with any number of processes ticking; but every one of them pays a wake-up and a database
round trip per tick to learn, mostly, that there was nothing to do (an idle 2-worker broker: the
timers job alone, at 0.5 s, was 4 calls a second). A :class:`Leadership` picks one process to tick
the jobs at their intervals; the others (followers) tick at a slow fallback pace only
(``follower_interval``, queen_pg/jobs/supervisor.py).

How: a connection of its own (not from the pool) asks ``pg_advisory_lock(key)`` at session level
and blocks until it gets it: a follower's backend sleeps on the lock wait, with no wake-up on either
side. The leader keeps the session open; when it ends (the process stops or dies, its connection is
closed or terminated, PostgreSQL notices a dead peer through the keepalives set below) PostgreSQL
frees the lock and one follower's wait returns at once: it is leader and :attr:`news` tells its
jobs to tick now. The leader that loses its connection is a follower from that moment, and dials again
(backed off). Nothing depends on it for correctness: the procedure's own try-lock still elects one
leader per tick, so two processes that both believe they lead for a moment do the work once, and a
follower's fallback tick covers a leader that holds the lock but does not tick (a stuck event loop,
a pool that cannot connect).
"""

from __future__ import annotations

import asyncio
import logging
import random

import asyncpg

log = logging.getLogger("queen_pg.jobs")

BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 30.0
CLOSE_TIMEOUT_S = 2.0
# a leader whose host vanished without closing its TCP connection is noticed by PostgreSQL in about
# idle + interval x count seconds (these are ignored on a Unix socket, where the kernel knows at once)
KEEPALIVES = {"tcp_keepalives_idle": "10", "tcp_keepalives_interval": "5", "tcp_keepalives_count": "3"}


class Leadership:
    """Whether this process holds advisory lock ``key`` at session level, kept by :meth:`run`."""

    def __init__(self, dsn: str, key: int, name: str) -> None:
        self.dsn = dsn
        self.key = key
        self.name = name
        self.leader = False
        self.news = asyncio.Event()  # set when leadership is won or lost, then replaced by a fresh one
        self.terms = 0  # times this process became leader (metrics, tests)
        self._conn: asyncpg.Connection | None = None

    def _set(self, leader: bool) -> None:
        if leader != self.leader:
            self.leader = leader
            self.news.set()  # every job waiting on this one wakes
            self.news = asyncio.Event()
            if leader:
                self.terms += 1
            log.info("event=leadership job=%s leader=%s", self.name, leader)

    async def _hold(self) -> None:
        """One session: connect, wait for the lock, lead until the connection ends."""
        ended = asyncio.Event()
        conn = await asyncpg.connect(
            self.dsn, server_settings={"application_name": f"queen-pg leader:{self.name}", **KEEPALIVES}
        )
        self._conn = conn
        try:
            conn.add_termination_listener(lambda _c: ended.set())
            await conn.execute("SELECT pg_advisory_lock($1)", self.key)  # blocks while another leads
            self._set(True)
            await ended.wait()  # the lock is ours for as long as the session lasts
        finally:
            self._set(False)
            self._conn = None
            # A backend waiting on a lock does not notice its client going away: a cancelled wait is
            # cancelled in PostgreSQL first (asyncpg sends the CancelRequest; close() awaits it), or the
            # backend would wait on, and take the lock for a session nobody reads.
            try:
                await conn.close(timeout=CLOSE_TIMEOUT_S)
            except asyncio.CancelledError:
                conn.terminate()
                raise
            except Exception:  # the session is over either way
                conn.terminate()

    async def run(self) -> None:
        """Until cancelled: lead when the lock is free, else wait for it; redial after a lost session."""
        delay = BACKOFF_MIN_S
        rng = random.Random()
        while True:
            try:
                await self._hold()
                delay = BACKOFF_MIN_S  # the session was up: dial again soon
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                log.warning(
                    "event=leadership_error job=%s retry_in_s=%.1f error=%s: %s",
                    self.name,
                    delay,
                    exc.__class__.__name__,
                    exc,
                )
            await asyncio.sleep(delay * rng.uniform(0.5, 1.5))
            delay = min(delay * 2, BACKOFF_MAX_S)

    @property
    def backend_pid(self) -> int | None:
        """The PostgreSQL backend of this process's leadership session (tests), None when not connected."""
        conn = self._conn
        return None if conn is None or conn.is_closed() else int(conn.get_server_pid())
