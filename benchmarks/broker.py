"""The broker under test: ``queen-pg serve`` as a subprocess, embedded PostgreSQL in a temporary dir.

The data dir sits under a fresh directory in the system temp dir made searchable (0711): as root,
PostgreSQL runs as the ``postgres`` account, which must be able to enter every parent of its data dir.
Everything is removed on stop.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from benchmarks.machine import ROOT

if TYPE_CHECKING:
    from queen_pg.embedded_pg import EmbeddedPostgres


class BenchError(RuntimeError):
    """The broker or the load generator failed: the scenario has no result."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def scratch_postgres(prefix: str, fast: bool = True) -> Iterator[EmbeddedPostgres]:
    """A throwaway embedded PostgreSQL in a new temporary directory, started; stopped and removed on exit."""
    from queen_pg.embedded_pg import EmbeddedPostgres

    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    tmp.chmod(0o711)  # searchable by the postgres account (when run as root)
    pg = EmbeddedPostgres(data_dir=tmp / "data", port=free_port(), fast=fast)
    try:
        pg.start()
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def print_load() -> float:
    """The 1-minute load average beside the figures (they are a lower bound on a busy machine); returned."""
    load = os.getloadavg()[0]
    print(f"load average (1 min): {load:.2f} on {os.cpu_count()} cpus")
    return load


def http(method: str, url: str, body: Any = None, timeout: float = 30.0) -> tuple[int, Any]:
    """One small request with the standard library (set-up and teardown only, never measured)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def wait_healthy(url: str, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise BenchError(f"the broker exited during start-up (rc={proc.returncode})")
        try:
            status, body = http("GET", url + "/health", timeout=2)
            if status == 200:
                return
            last = f"{status} {body}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.1)
    raise BenchError(f"the broker at {url} did not answer /health with 200 within {timeout:.0f} s: {last}")


def delete_queue(url: str, queue: str) -> None:
    http("DELETE", f"{url}/api/v1/resources/queues/{quote(queue, safe='')}", timeout=300)


class BrokerProcess:
    """``queen-pg serve`` on free ports with an embedded PostgreSQL of its own."""

    def __init__(
        self,
        workers: int | None = None,
        log_level: str = "warning",
        env: dict[str, str] | None = None,
        root: Path | None = None,
    ) -> None:
        """``root``: run another source tree's broker (its ``.venv``), e.g. the old side of an A/B."""
        self.workers = workers
        self.root = root
        self.extra_env = env or {}
        self.log_level = log_level
        self.port = free_port()
        self.pg_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tmp: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def data_dir(self) -> Path:
        assert self.tmp is not None
        return self.tmp / "data"

    @property
    def log_path(self) -> Path:
        assert self.tmp is not None
        return self.tmp / "broker.log"

    def pg_dsn(self) -> str:
        from queen_pg.embedded_pg import EmbeddedPostgres

        return EmbeddedPostgres(data_dir=self.data_dir, port=self.pg_port).dsn()

    def pg_admin_dsn(self) -> str:
        """Its bootstrap superuser (creating and dropping the peers' throwaway database)."""
        from queen_pg.embedded_pg import EmbeddedPostgres

        return EmbeddedPostgres(data_dir=self.data_dir, port=self.pg_port).admin_dsn("postgres")

    def start(self, timeout: float = 120.0) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="queen-bench-"))
        self.tmp.chmod(0o711)  # searchable by the postgres account, not listable
        python = sys.executable if self.root is None else str(self.root / ".venv" / "bin" / "python")
        cmd = [
            python, "-m", "queen_pg.cli", "serve",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--data-dir", str(self.data_dir), "--pg-port", str(self.pg_port),
            "--log-level", self.log_level,
        ]  # fmt: skip
        if self.workers is not None:
            cmd += ["--workers", str(self.workers)]
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "QUEEN_DATABASE_URL")}
        env |= self.extra_env
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(
                cmd, cwd=self.root or ROOT, env=env, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf
            )
        try:
            wait_healthy(self.url, timeout, self.proc)
        except BenchError as exc:
            tail = self.log_tail()
            self.stop()
            raise BenchError(f"{exc}\n--- broker log ---\n{tail}") from None

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the CLI stops uvicorn, then the embedded PostgreSQL
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def __enter__(self) -> BrokerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
