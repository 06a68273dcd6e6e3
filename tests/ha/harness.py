"""Driving deploy/ha/run.py (``make ha``) from a test: start it, read its ``ha-ready`` line, ask
Patroni's REST API who leads, find a node's processes, stop it all as Ctrl-C does."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import free_port

RUN = Path(__file__).resolve().parents[2] / "deploy" / "ha" / "run.py"


async def read_ready(proc: subprocess.Popen[str], log: list[str], within: float) -> dict[str, Any]:
    """The ``ha-ready {json}`` line of run.py; every line before it is kept in ``log``."""
    assert proc.stdout is not None
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        line = await asyncio.to_thread(proc.stdout.readline)
        if not line:
            pytest.fail(f"run.py exited ({proc.wait()}) before it was ready:\n" + "".join(log))
        log.append(line)
        if line.startswith("ha-ready "):
            ready: dict[str, Any] = json.loads(line.removeprefix("ha-ready "))
            return ready
    pytest.fail("run.py not ready in time:\n" + "".join(log))


@contextlib.asynccontextmanager
async def cluster(state: Path, venv: Path, base_port: int, *args: str) -> AsyncIterator[dict[str, Any]]:
    """run.py from empty directories; yields its ``ha-ready`` dict (plus ``state``, ``log``, ``t0``).
    On exit: SIGINT (Ctrl-C), and run.py must stop everything and exit 0."""
    cmd = [sys.executable, str(RUN), "--state-dir", str(state), "--fresh", "--port", str(free_port()),
           "--base-port", str(base_port), "--patroni-venv", str(venv), *args]  # fmt: skip
    log: list[str] = []
    t0 = time.monotonic()
    proc = await asyncio.to_thread(subprocess.Popen, cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready = await read_ready(proc, log, within=300)
        yield {**ready, "state": state, "log": log, "t0": t0}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # what Ctrl-C on `make ha` does
            try:
                out, _ = await asyncio.to_thread(proc.communicate, timeout=120)
                log.append(out)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == 0, "".join(log)
    assert "ha: stopped" in "".join(log)


async def members(rest: list[str]) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(timeout=2) as c:
        for url in rest:
            try:
                r = await c.get(f"{url}/cluster")
            except httpx.HTTPError:
                continue
            found: list[dict[str, Any]] = r.json()["members"]
            return found
    return []


async def leader(rest: list[str]) -> str | None:
    return next((m["name"] for m in await members(rest) if m["role"] == "leader"), None)


async def settled(rest: list[str]) -> bool:
    """A leader, a synchronous standby and a replica, both replicas streaming: ready for the next fault."""
    ms = await members(rest)
    roles = sorted(m["role"] for m in ms)
    return roles == ["leader", "replica", "sync_standby"] and all(
        m["state"] == "streaming" for m in ms if m["role"] != "leader"
    )


def postmaster_pid(state: Path, node: str) -> int:
    pid = int((state / node / "data" / "postmaster.pid").read_text().split()[0])
    assert pid > 1
    return pid


def patroni_pid(state: Path, node: str) -> int:
    """The pid of node ``node``'s Patroni (its command line names its configuration file)."""
    conf = str(state / f"{node}.yml").encode()
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (d / "cmdline").read_bytes().split(b"\0")
                if conf in argv and any(a.endswith(b"/patroni") for a in argv):
                    found.append(int(d.name))
    assert len(found) == 1 and found[0] > 1, found
    return found[0]
