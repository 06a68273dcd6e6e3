"""`queen-pg serve` as a real child process on a test database: for behaviour that belongs to the
process (signals, memory, sockets), as an operator runs it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import free_port
from tests.helpers import until_healthy


class ServeProcess:
    def __init__(self, db_url: str, log_path: Path, new_session: bool = False, **env: str) -> None:
        self.new_session = new_session  # its own process group (os.killpg), as a service manager runs it
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.env = {
            **os.environ,
            "DATABASE_URL": db_url,
            "PORT": str(self.port),
            "QUEEN_HOST": "127.0.0.1",
            "QUEEN_JOBS_ENABLED": "0",
            "QUEEN_APPLY_SCHEMA": "0",  # the test database is a copy of the template that holds sql/
            "QUEEN_LOG_LEVEL": "info",
            **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def process(self) -> subprocess.Popen[bytes]:
        if self.proc is None:
            raise RuntimeError("the broker process was never started")
        return self.proc

    @property
    def pid(self) -> int:
        return self.process.pid

    def spawn(self) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "queen_pg.cli", "serve"],
                env=self.env,
                stdout=out,
                stderr=out,
                start_new_session=self.new_session,
            )
        return self.proc

    async def start(self) -> None:
        proc = await asyncio.to_thread(self.spawn)

        def alive() -> None:
            assert proc.poll() is None, f"the broker exited: {self.log()}"

        await until_healthy(self.url, "the broker to answer /health", 60, alive)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss_kib(self) -> int:
        return self._status_kib("VmRSS")

    def peak_kib(self) -> int:
        """The process's peak resident set (VmHWM): what a short-lived allocation left behind."""
        return self._status_kib("VmHWM")

    def _status_kib(self, field: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
        raise AssertionError(f"no {field} line")

    def terminate(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
