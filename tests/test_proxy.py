"""Three replicas on one PostgreSQL behind a real HAProxy (the distribution's package, installed here
with apt-get when missing; the test skips, saying why, only when it cannot be installed): round-robin
with keep-alive, pushes through the proxy wake long-polls parked on every replica through the mesh,
X-Forwarded-For is believed from the proxy only, and a replica SIGTERMed under load is drained
without a failed client request."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port
from tests.helpers import until, until_healthy
from tests.replicas import Replica

SAMPLE = Path(__file__).resolve().parent.parent / "deploy" / "haproxy.cfg"


def haproxy() -> str:
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
        for step in ([], ["update"]):  # a clean machine may have no package lists yet
            if step:
                subprocess.run(["apt-get", *step], env=env, capture_output=True, check=False, timeout=300)
            subprocess.run(
                ["apt-get", "install", "-y", "haproxy"], env=env, capture_output=True, check=False, timeout=300
            )
            if shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin:/usr/bin"):
                break
        found = shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin:/usr/bin")
        if found:
            return found
    pytest.skip("HAProxy is not installed and `apt-get install -y haproxy` could not install it (needs root and apt)")


def render(port: int, backends: list[int]) -> str:
    """The sample deploy/haproxy.cfg with this test's addresses (and no admin socket)."""
    text = SAMPLE.read_text()
    text = re.sub(r"^\s*stats socket.*\n", "", text, flags=re.M)
    text = text.replace("bind :6632", f"bind 127.0.0.1:{port}")
    text = re.sub(r"^\s*server r\d .*\n", "", text, flags=re.M)
    servers = "".join(f"    server r{i + 1} 127.0.0.1:{p} check\n" for i, p in enumerate(backends))
    return text.rstrip("\n") + "\n" + servers


def start_haproxy(exe: str, tmp_path: Path, replicas: list[Replica]) -> tuple[subprocess.Popen[bytes], str]:
    """HAProxy with the sample config in front of ``replicas``, and its URL, once it routes /health."""
    port = free_port()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(render(port, [r.port for r in replicas]))
    check = subprocess.run([exe, "-c", "-f", str(cfg)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr  # the sample config is valid HAProxy
    with open(tmp_path / "haproxy.log", "wb") as log:
        return subprocess.Popen([exe, "-db", "-f", str(cfg)], stdout=log, stderr=log), f"http://127.0.0.1:{port}"


@pytest.fixture
async def cluster(db_url: str, tmp_path: Path) -> AsyncIterator[tuple[str, list[Replica]]]:
    exe = haproxy()
    mesh_ports = [free_port() for _ in range(3)]
    peers = ",".join(f"127.0.0.1:{p}" for p in mesh_ports)
    replicas = [
        Replica(
            db_url,
            tmp_path,
            f"r{i + 1}",
            mesh_port=mesh_ports[i],
            mesh_peers=peers,
            mesh_secret="proxy-test",
            trusted_proxies="127.0.0.1",
            log_level="debug",
            pop_poll_interval_ms=60_000,  # only the mesh can wake a pop within the test
            pop_poll_max_ms=600_000,
            jobs_enabled=0,
        )
        for i in range(3)
    ]
    proxy: subprocess.Popen[bytes] | None = None
    try:
        await asyncio.gather(*(r.start() for r in replicas))
        proxy, url = start_haproxy(exe, tmp_path, replicas)

        def alive() -> None:
            assert proxy is not None and proxy.poll() is None, (tmp_path / "haproxy.log").read_text()

        await until_healthy(url, "HAProxy to route /health", 20, alive)
        yield url, replicas
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(10)
        for r in replicas:
            r.stop()


async def test_pushes_through_the_proxy_wake_pops_parked_on_every_replica(
    cluster: tuple[str, list[Replica]],
) -> None:
    url, replicas = cluster
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        assert (await http.post("/api/v1/configure", json={"queue": "px"})).status_code == 200

    async def pop_once() -> httpx.Response:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:  # its own connection: round-robin
            return await c.get("/api/v1/pop/queue/px", params={"wait": "true", "timeout": 30_000})

    pops = [asyncio.create_task(pop_once()) for _ in range(6)]

    async def spread() -> bool:
        parked = [await r.parked() for r in replicas]
        return sum(parked) == 6 and min(parked) >= 1

    await until(spread, "6 pops parked, at least one on every replica", within=20)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:  # keep-alive: one connection
        for i in range(6):
            item = {"queue": "px", "partition": f"p{i}", "payload": i}
            r = await http.post("/api/v1/push", json={"items": [item]})
            assert r.status_code == 201, r.text
    answers = await asyncio.gather(*pops)
    # every pop answered with a message long before its 30 s timeout and B's 60 s re-check
    assert [a.status_code for a in answers] == [200] * 6
    assert sorted(a.json()["messages"][0]["data"] for a in answers) == list(range(6))


async def test_forwarded_for_is_believed_from_the_proxy_only(cluster: tuple[str, list[Replica]]) -> None:
    url, replicas = cluster
    via_other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    async with httpx.AsyncClient(base_url=url, transport=via_other) as http:
        r = await http.get("/api/v1/resources/queues", headers={"X-Forwarded-For": "6.6.6.6", "X-Test": "1"})
        assert r.status_code == 200
    # straight to a replica, not through the trusted proxy: the header is ignored
    direct = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    async with httpx.AsyncClient(base_url=replicas[0].url, transport=direct) as http:
        await http.get("/api/v1/resources/queues/direct-probe", headers={"X-Forwarded-For": "7.7.7.7"})

    def lines() -> tuple[list[str], list[str]]:
        logs = "".join(r.log() for r in replicas).splitlines()
        mine = [line for line in logs if "event=request" in line and "/api/v1/resources/queues" in line]
        return [line for line in mine if "path=/api/v1/resources/queues " in line], [
            line for line in mine if "direct-probe" in line
        ]

    # the line is written once the answer has gone out: wait for it
    await until(lambda: _true(all(lines())), "both requests in the replicas' logs")
    via_proxy, straight = lines()
    # through HAProxy: the client is the proxy's view of it (127.0.0.2), not the forged 6.6.6.6
    assert all("client=127.0.0.2" in line for line in via_proxy), via_proxy
    assert all("client=127.0.0.2" in line for line in straight), straight
    logs = "".join(r.log() for r in replicas)
    assert "6.6.6.6" not in logs and "7.7.7.7" not in logs


async def test_a_replica_sigtermed_under_load_is_drained_without_a_failed_request(
    cluster: tuple[str, list[Replica]],
) -> None:
    url, replicas = cluster
    failures: list[str] = []
    done = {"push": 0, "pop": 0}
    stop = asyncio.Event()

    async def producer(n: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            i = 0
            while not stop.is_set():
                item = {"queue": "drain", "partition": f"p{n}", "transactionId": f"{n}-{i}", "payload": i}
                try:
                    r = await http.post("/api/v1/push", json={"items": [item]})
                    if r.status_code != 201:
                        failures.append(f"push {r.status_code} {r.text[:200]}")
                    done["push"] += 1
                except httpx.HTTPError as exc:
                    failures.append(f"push {exc!r}")
                i += 1

    async def consumer() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            while not stop.is_set():
                try:
                    r = await http.get(
                        "/api/v1/pop/queue/drain", params={"wait": "true", "timeout": 2000, "autoAck": "true"}
                    )
                    if r.status_code not in (200, 204):
                        failures.append(f"pop {r.status_code} {r.text[:200]}")
                    done["pop"] += 1
                except httpx.HTTPError as exc:
                    failures.append(f"pop {exc!r}")

    tasks = [asyncio.create_task(producer(n)) for n in range(3)] + [asyncio.create_task(consumer()) for _ in range(3)]
    try:
        await until(lambda: _true(done["push"] >= 30 and done["pop"] >= 3), "load to flow", within=20)
        victim = replicas[1]
        before = dict(done)
        victim.send(signal.SIGTERM)
        assert victim.proc is not None
        async with httpx.AsyncClient(base_url=victim.url, timeout=5) as direct:  # the proxy's health check sees it

            async def draining() -> bool:
                r = await direct.get("/health")
                return r.status_code == 503 and r.json()["status"] == "draining"

            await until(draining, "the victim's /health to answer 503 draining", within=10)
        await until(lambda: _true(victim.proc is not None and victim.proc.poll() is not None), "drain", within=40)
        await until(lambda: _true(done["push"] >= before["push"] + 30), "load after the drain", within=20)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    assert victim.proc.returncode == 0, victim.log()[-3000:]
    assert failures == [], failures[:10]


async def _true(value: bool) -> bool:
    return value
