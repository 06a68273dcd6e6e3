"""``queen-pg serve --workers N``: N uvicorn worker processes, each with its own listening socket.

The N sockets share one address (SO_REUSEPORT), so the kernel spreads new connections over the
workers by a hash of each connection's addresses. With one shared socket, whichever worker woke
first accepted: a burst of connections (a client pool opening at start) often landed on one worker
while the other idled (12 of 30 trials put all 10 connections of a pool on one worker). The sockets
belong to this process; a worker that dies leaves its socket queueing connections until the
supervisor's replacement serves them, so none is refused. A second broker on the same port still
fails to start (the port is probed without SO_REUSEPORT first).

The parent process (``queen_pg.cli.serve``) has already started the embedded PostgreSQL, if any,
before anything else. Here it applies ``sql/`` once (the workers then skip it), exports every
setting to the environment, where each worker's ``queen_pg.app:app_from_env`` reads them back
(the embedded database's DSN included), sets up prometheus-client's multiprocess directory so
that ``/metrics`` answers for all the workers whichever one is asked, and runs the supervisor
below (uvicorn's worker processes, one socket each, restarted if one dies).

Every worker runs the background jobs: each tick elects one leader through
``pg_try_advisory_xact_lock`` (docs/architecture.md#advisory-keys), so N workers do the work once, as N replicas would.
Each worker has its own pool of ``db_pool_size`` connections: N x that in total.

The workers are peers of the wake mesh (``queen_pg/mesh/``): each listens on ``<pid>.sock`` in a
private directory made here (``mesh_local_dir``) and dials its siblings', so a push served by one
worker wakes the pops parked on another at once. With ``mesh_port`` set they also share that TCP
port (SO_REUSEPORT) and relay what a remote replica tells one of them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from queen_pg.metrics import MULTIPROC_ENV
from queen_pg.settings import Settings

if TYPE_CHECKING:
    import uvicorn
    from uvicorn.supervisors.multiprocess import Process

APP_FACTORY = "queen_pg.app:app_from_env"


def export_settings(settings: Settings, environ: MutableMapping[str, str]) -> None:
    """Write ``settings`` into ``environ`` so that ``Settings()`` in a worker reads them back
    exactly; a field that is None is removed, so a stale variable cannot come back."""
    data = settings.model_dump(mode="json")
    for field in Settings.model_fields:
        value = data[field]
        for name in Settings.env_names(field):
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value if isinstance(value, str) else orjson.dumps(value).decode()


async def _apply_schema_once(url: str) -> None:
    from queen_pg.db.pool import Database

    db = Database(url, 2)
    await db.open(apply_schema=True)
    await db.close()


log = logging.getLogger("queen_pg.workers")


class PortInUse(Exception):
    pass


def listen_sockets(host: str, port: int, n: int) -> list[socket.socket]:
    """``n`` sockets bound to one TCP address with SO_REUSEPORT (each worker listens on its own).
    The address is first bound once without SO_REUSEPORT, so a port that another process holds,
    with or without that option, raises :class:`PortInUse` instead of being shared. Port 0 picks
    one free port for all of them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
        port = probe.getsockname()[1]
    except OSError as exc:
        raise PortInUse(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    finally:
        probe.close()
    out: list[socket.socket] = []
    try:
        for _ in range(n):
            sock = socket.socket(family, socket.SOCK_STREAM)
            out.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            sock.set_inheritable(True)
    except OSError as exc:
        for sock in out:
            sock.close()
        raise PortInUse(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return out


# How long a worker started by SIGHUP gets to serve before the swap is aborted (the old one is kept).
# A worker's start-up opens its pool and joins the mesh; on a loaded host it took 15 s, three times
# uvicorn's 5 s health-check timeout, which used to abort every swap there.
READY_TIMEOUT_S = 60.0


class Supervisor:
    """Worker ``i`` serves ``sockets[i]``; a worker that exits or stops answering uvicorn's health
    ping is replaced on the same socket, unless it failed during start-up (the app, the settings or
    the database would fail the same way again: the supervisor stops). SIGTERM/SIGINT stop the
    workers (each drains as a lone server does); SIGHUP replaces them one by one, the new one
    serving before the old one is stopped. The workers are uvicorn's own ``Process`` (spawned, with
    its ping/pong health check); only the socket per worker is ours. ``gone(pid)`` runs for every
    worker that ended, however it ended (a killed worker cannot clean up after itself)."""

    def __init__(
        self, config: uvicorn.Config, sockets: list[socket.socket], gone: Callable[[int], None] = lambda pid: None
    ) -> None:
        self.config = config
        self.sockets = sockets
        self.gone = gone
        self.processes: list[Process] = []
        self.should_exit = threading.Event()
        self.failed = False
        self._signals: list[int] = []

    def _start(self, i: int) -> Process:
        from uvicorn.supervisors.multiprocess import Process

        proc = Process(self.config, [self.sockets[i]])
        proc.start()
        return proc

    def run(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, lambda sig, _frame: self._signals.append(sig))
        log.info("event=workers_start workers=%d supervisor=%d", len(self.sockets), os.getpid())
        self.processes = [self._start(i) for i in range(len(self.sockets))]
        while not self.should_exit.wait(0.5):
            while self._signals:
                if self._signals.pop(0) == signal.SIGHUP:
                    self._restart_all()
                else:
                    self.should_exit.set()
            if not self.should_exit.is_set():
                self._keep_alive()
        for proc in self.processes:
            proc.terminate()
        for proc in self.processes:
            self._join(proc)
        log.info("event=workers_stop supervisor=%d", os.getpid())

    def _keep_alive(self) -> None:
        from uvicorn.config import STARTUP_FAILURE

        for i, proc in enumerate(self.processes):
            if self.should_exit.is_set() or proc.is_alive(timeout=self.config.timeout_worker_healthcheck):
                continue
            proc.kill()  # gone, or hung: not answering the ping
            self._join(proc)
            if proc.exitcode == STARTUP_FAILURE:
                log.error("event=worker_start_failed pid=%s: stopping", proc.pid)
                self.failed = True
                self.should_exit.set()
                return
            log.warning("event=worker_replaced pid=%s exitcode=%s socket=%d", proc.pid, proc.exitcode, i)
            self.processes[i] = self._start(i)

    def _restart_all(self) -> None:
        log.info("event=workers_restart workers=%d", len(self.processes))
        for i, old in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            new = self._start(i)
            if not new.wait_until_ready(READY_TIMEOUT_S, self.should_exit):
                new.kill()
                self._join(new)
                log.error("event=workers_restart_aborted pid=%s: not ready in time; keeping %s", new.pid, old.pid)
                return
            old.terminate()
            self._join(old)
            self.processes[i] = new

    def _join(self, proc: Process) -> None:
        proc.join()
        if proc.pid is not None:
            self.gone(proc.pid)


def _metrics_gone(pid: int, metrics_dir: str) -> None:
    """Drop an ended worker's live gauges (pool, waiters...) from the shared metrics directory: a
    worker removes its own when it stops cleanly, a killed one cannot."""
    from prometheus_client.multiprocess import mark_process_dead

    mark_process_dead(pid, metrics_dir)  # type: ignore[no-untyped-call]


def serve_workers(settings: Settings) -> int:
    from queen_pg.server import uvicorn_config

    if settings.apply_schema and settings.database_url:
        asyncio.run(_apply_schema_once(settings.database_url))
        settings = settings.model_copy(update={"apply_schema": False})
    mesh_dir = None
    if settings.mesh_local_dir is None:  # the workers wake each other through Unix sockets here
        mesh_dir = tempfile.mkdtemp(prefix="queen-pg-mesh-")  # mode 0700: only this user's processes
        settings = settings.model_copy(update={"mesh_local_dir": Path(mesh_dir)})
    export_settings(settings, os.environ)
    own_dir = not os.environ.get(MULTIPROC_ENV)
    if own_dir:
        os.environ[MULTIPROC_ENV] = tempfile.mkdtemp(prefix="queen-pg-metrics-")
    metrics_dir = os.environ[MULTIPROC_ENV]
    try:
        config = uvicorn_config(APP_FACTORY, settings, factory=True, workers=settings.workers)
        try:
            sockets = listen_sockets(settings.host, settings.port, settings.workers)
        except PortInUse as exc:
            print(f"queen-pg: {exc}", file=sys.stderr, flush=True)
            return 1
        supervisor = Supervisor(config, sockets, gone=lambda pid: _metrics_gone(pid, metrics_dir))
        port = sockets[0].getsockname()[1]
        print(f"queen-pg: {settings.workers} workers on {settings.host}:{port}, one socket each", flush=True)
        try:
            supervisor.run()  # until SIGTERM/SIGINT; SIGHUP restarts the workers one by one
        finally:
            for sock in sockets:
                sock.close()
        if supervisor.failed:
            print("queen-pg: a worker failed to start (see the log above)", file=sys.stderr, flush=True)
            return 1
        return 0
    finally:
        if mesh_dir is not None:
            shutil.rmtree(mesh_dir, ignore_errors=True)
        if own_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)
            os.environ.pop(MULTIPROC_ENV, None)
