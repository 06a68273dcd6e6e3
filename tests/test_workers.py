"""`queen-pg serve --workers N`: one listening socket per worker (SO_REUSEPORT), as an operator runs it.

With one shared socket a burst of new connections often all went to one worker; with a socket each
the kernel spreads them by their addresses. A worker that dies leaves its socket open in the
supervisor, so connections hashed to it wait for the replacement instead of being refused.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from queen_pg.cli_workers import PortInUse, listen_sockets
from tests.helpers import until
from tests.serve_process import ServeProcess

WORKER_METRICS = "/api/v1/analytics/worker-metrics"


async def _pids_of_new_connections(url: str, n: int, wait_s: float = 5) -> list[int]:
    """The pid of the worker answering each of ``n`` requests, each on a connection of its own."""

    async def one() -> int:
        async with httpx.AsyncClient(base_url=url, timeout=wait_s) as http:
            r = await http.get(WORKER_METRICS)
            assert r.status_code == 200, r.text
            return int(r.json()["workers"][0]["pid"])

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def test_new_connections_reach_both_workers_and_a_dead_one_is_replaced_on_its_socket(
    db_url: str, tmp_path: Path
) -> None:
    broker = ServeProcess(db_url, tmp_path / "broker.log", QUEEN_WORKERS="2", QUEEN_DB_POOL_SIZE="3")
    try:
        await broker.start()

        async def both_up() -> bool:
            return broker.log().count("Application startup complete.") == 2

        await until(both_up, "both workers to finish start-up", within=60)
        # 24 connections opened at once: with a socket per worker, all on one worker has odds 2^-23
        pids = await _pids_of_new_connections(broker.url, 24)
        workers = set(pids)
        assert len(workers) == 2, pids
        assert "one socket each" in broker.log()

        victim = pids[0]
        os.kill(victim, signal.SIGKILL)
        # every new connection is answered, those hashed to the dead worker's socket once its
        # replacement serves it: none is refused (a refused connect fails the request)
        later = await _pids_of_new_connections(broker.url, 24, wait_s=60)
        assert victim not in later
        assert len(set(later)) == 2, later
        assert set(later) - workers, "a replacement worker answered"
        assert f"event=worker_replaced pid={victim}" in broker.log()
        # the killed worker's live gauges are gone from /metrics: two pools of 3, not three
        async with httpx.AsyncClient(base_url=broker.url, timeout=5) as http:

            async def two_pools() -> bool:
                text = (await http.get("/metrics")).text
                return "queen_db_pool_max_connections 6.0" in text

            await until(two_pools, "the pool gauge of two workers", within=20)

        broker.terminate()
        assert await asyncio.to_thread(broker.process.wait, 30) == 0, broker.log()
    finally:
        broker.kill()


def test_a_port_held_by_another_process_is_not_shared() -> None:
    """The probe bind has no SO_REUSEPORT: a port another process listens on, with or without that
    option (e.g. a second broker), is an error, not a silent half of the traffic."""
    for reuseport in (False, True):
        holder = socket.socket()
        try:
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, int(reuseport))
            holder.bind(("127.0.0.1", 0))
            holder.listen()
            port = holder.getsockname()[1]
            try:
                listen_sockets("127.0.0.1", port, 2)
            except PortInUse as exc:
                assert f"127.0.0.1:{port}" in str(exc)
            else:
                raise AssertionError(f"bound a held port (holder SO_REUSEPORT={reuseport})")
        finally:
            holder.close()


def test_port_zero_gives_every_worker_the_same_port() -> None:
    socks = listen_sockets("127.0.0.1", 0, 3)
    try:
        ports = {s.getsockname()[1] for s in socks}
        assert len(ports) == 1 and ports != {0}
    finally:
        for s in socks:
            s.close()


def test_serve_refuses_a_port_in_use(db_url: str, tmp_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        env = {**os.environ, "DATABASE_URL": db_url, "PORT": str(port), "QUEEN_HOST": "127.0.0.1",
               "QUEEN_APPLY_SCHEMA": "0", "QUEEN_JOBS_ENABLED": "0"}  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "queen_pg.cli", "serve", "--workers", "2"],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    finally:
        holder.close()


async def test_sighup_replaces_the_workers_one_by_one_without_refusing_a_connection(
    db_url: str, tmp_path: Path
) -> None:
    broker = ServeProcess(db_url, tmp_path / "broker.log", QUEEN_WORKERS="2")
    try:
        await broker.start()

        async def both_up() -> bool:
            return broker.log().count("Application startup complete.") == 2

        await until(both_up, "both workers to finish start-up", within=60)
        before = set(await _pids_of_new_connections(broker.url, 24))
        broker.process.send_signal(signal.SIGHUP)

        async def replaced() -> bool:
            await _pids_of_new_connections(broker.url, 8, wait_s=30)  # answered while the workers are swapped
            return broker.log().count("Application startup complete.") == 4 and not (
                set(await _pids_of_new_connections(broker.url, 24)) & before
            )

        await until(replaced, "both workers replaced", within=90)
        assert "event=workers_restart workers=2" in broker.log()
        broker.terminate()
        assert await asyncio.to_thread(broker.process.wait, 30) == 0, broker.log()
    finally:
        broker.kill()
