"""Broker replicas as real processes (``python -m queen_pg.cli serve``) on one PostgreSQL, for the
mesh and proxy tests: each has its own HTTP port and, when asked, a mesh port and peers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import free_port
from tests.helpers import until_healthy


class Replica:
    def __init__(self, db_url: str, log_dir: Path, name: str, **settings: Any) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{name}.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_") and k != "PORT"}
        self.env.update(DATABASE_URL=db_url, PORT=str(self.port), QUEEN_HOST="127.0.0.1", QUEEN_DB_POOL_SIZE="4")
        for key, value in settings.items():
            self.env[f"QUEEN_{key.upper()}"] = str(value)
        self.proc: subprocess.Popen[bytes] | None = None

    def launch(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "queen_pg.cli", "serve"], env=self.env, stdout=log, stderr=log
            )

    async def start(self) -> None:
        self.launch()

        def alive() -> None:
            assert self.proc is not None and self.proc.poll() is None, self.log()

        await until_healthy(self.url, f"replica {self.name} to answer /health", 30, alive)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def send(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    async def parked(self) -> int:
        async with httpx.AsyncClient(timeout=5) as c:
            r = await c.get(f"{self.url}/api/v1/analytics/system-metrics")
            return int(r.json()["longPoll"]["parked"])
