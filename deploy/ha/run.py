"""``make ha``: queen-pg on highly available PostgreSQL, all on this machine's loopback.

Starts, in order: etcd (one member), three PostgreSQL nodes managed by Patroni (synchronous
replication, strict: deploy/ha/patroni.yml), the broker's role and database on the primary, two
broker replicas (meshed) that follow the primary, and HAProxy (deploy/ha/haproxy.cfg) in front of the
brokers and of the primary. Prints where to reach everything, then waits; Ctrl-C (or SIGTERM) stops
it all, brokers first, etcd last. The data stays in the state directory (``.queen-ha`` by default) and
the next run resumes the same cluster; ``--fresh`` starts from empty directories.

As root, PostgreSQL and Patroni run as the ``postgres`` account (PostgreSQL refuses root); Patroni gets
its own virtualenv (the ``ha`` extra of pyproject.toml) built from the system Python, which that account
can run. etcd and HAProxy come from Debian (``apt-get install`` when missing, as root).

    python deploy/ha/run.py [--state-dir DIR] [--fresh] [--db via-proxy|multi-host] [--port 6632]

The last line printed once everything serves is ``ha-ready {json}`` (the addresses and timings), for
scripts (tests/ha/harness.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

from queen_pg.pg_binaries import find_pg_bin, reachable_bin, sh_ok  # noqa: E402

NODES = 3
BROKERS = 2
SYSTEM_PYTHON = "/usr/bin/python3"
FALLBACK_STATE = Path("/var/lib/queen-pg/ha")  # when the postgres account cannot enter ./.queen-ha


class Fatal(Exception):
    """The cluster cannot come up: the message says why and where the logs are."""


def say(msg: str) -> None:
    print(f"ha: {msg}", flush=True)


@dataclass
class Ports:
    """Every port of the cluster, from one base (all on 127.0.0.1)."""

    base: int
    front: int  # HAProxy's broker door

    @property
    def etcd(self) -> int:
        return self.base

    @property
    def etcd_peer(self) -> int:
        return self.base + 1

    @property
    def pg_proxy(self) -> int:  # HAProxy's door to the primary
        return self.base + 10

    def pg(self, i: int) -> int:
        return self.base + 11 + i

    def rest(self, i: int) -> int:
        return self.base + 21 + i

    def broker(self, i: int) -> int:
        return self.base + 31 + i

    def mesh(self, i: int) -> int:
        return self.base + 41 + i


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    cmd: list[str]
    env: dict[str, str] | None
    died_at: float | None = None  # when the watcher saw it gone


@dataclass
class Cluster:
    state: Path
    ports: Ports
    db_mode: str
    workers: int
    account: tuple[int, int] | None  # (uid, gid) of postgres when we are root
    venv: Path | None = None  # Patroni's virtualenv (default: in the state directory)
    children: list[Child] = field(default_factory=list)
    secrets: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    # --- tools ------------------------------------------------------------------------------------

    def apt_install(self, *packages: str) -> None:
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            sys.exit(f"ha: {' '.join(packages)} missing; install it (Debian: apt-get install -y {' '.join(packages)})")
        say(f"installing {' '.join(packages)} from Debian (apt-get install -y {' '.join(packages)})")
        env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
        cmd = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
        if subprocess.run(cmd, env=env, capture_output=True, check=False).returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, capture_output=True, check=False)
            subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)

    def tool(self, name: str, *packages: str) -> str:
        path = "/usr/sbin:/usr/bin:/sbin:/bin:" + os.environ.get("PATH", "")
        found = shutil.which(name, path=path)
        if found is None:
            self.apt_install(*packages)
            found = shutil.which(name, path=path)
        if found is None:
            sys.exit(f"ha: {name} is still missing after installing {' '.join(packages)}")
        return found

    def patroni_venv(self) -> Path:
        """A virtualenv with the ``ha`` extra of pyproject.toml, from the system Python (the postgres
        account cannot run a Python under /root); rebuilt when the pins change."""
        reqs = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["ha"]
        venv = self.venv or self.state / "patroni-venv"
        stamp = venv / ".requirements"
        if stamp.is_file() and stamp.read_text() == "\n".join(reqs):
            return venv
        say(f"installing Patroni into {venv} ({', '.join(reqs)})")
        shutil.rmtree(venv, ignore_errors=True)
        if subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(venv)], capture_output=True, check=False).returncode:
            self.apt_install("python3-venv")
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", *reqs]
        with open(self.state / "logs" / "pip.log", "ab") as out:
            if subprocess.run(pip, stdout=out, stderr=subprocess.STDOUT, check=False).returncode != 0:
                sys.exit(f"ha: installing Patroni failed: see {self.state / 'logs' / 'pip.log'}")
        stamp.write_text("\n".join(reqs))
        return venv

    # --- processes --------------------------------------------------------------------------------

    def spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None, as_postgres: bool = False) -> Child:
        log = self.state / "logs" / f"{name}.log"
        if as_postgres and self.account is not None:
            cmd = ["setpriv", f"--reuid={self.account[0]}", f"--regid={self.account[1]}", "--init-groups", *cmd]
        child = Child(name, self.popen(cmd, env, log), log, cmd, env)
        self.children.append(child)
        return child

    @staticmethod
    def popen(cmd: list[str], env: dict[str, str] | None, log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            return subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd="/",
                start_new_session=True,  # Ctrl-C reaches this script only; it stops the children in order
            )  # fmt: skip

    def watch(self, restart_after: float) -> None:
        """Say when a child is gone; start a Patroni node again ``restart_after`` s later (as systemd's
        Restart= would on a real machine; longer than ``ttl``, so a killed node is first failed over)."""
        for c in self.children:
            if c.died_at is None and c.proc.poll() is not None:
                c.died_at = time.monotonic()
                again = (
                    f"; starting it again in {restart_after:.0f} s" if restart_after and c.name.startswith("pg") else ""
                )
                say(f"{c.name} exited with {c.proc.returncode} (log: {c.log}){again}")
            elif c.died_at is not None and restart_after and c.name.startswith("pg"):
                if time.monotonic() - c.died_at >= restart_after:
                    say(f"starting {c.name} again")
                    c.proc, c.died_at = self.popen(c.cmd, c.env, c.log), None

    def alive(self, child: Child) -> None:
        if child.proc.poll() is not None:
            tail = child.log.read_text(errors="replace").splitlines()[-15:]
            raise Fatal(
                f"{child.name} exited with {child.proc.returncode}; its log {child.log} ends:\n" + "\n".join(tail)
            )

    async def until(self, what: str, check: Any, within: float, *watch: Child) -> None:
        deadline = time.monotonic() + within
        while True:
            for c in watch:
                self.alive(c)
            with contextlib.suppress(Exception):
                if await check():
                    return
            if time.monotonic() > deadline:
                raise Fatal(f"gave up waiting {within:.0f} s for {what} (logs in {self.state / 'logs'})")
            await asyncio.sleep(0.2)

    def stop_all(self) -> None:
        """Brokers, HAProxy, Patroni (each stops its PostgreSQL), etcd: the reverse of the start."""
        for child in reversed(self.children):
            if child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
                try:
                    child.proc.wait(60)
                except subprocess.TimeoutExpired:
                    child.proc.kill()
                    child.proc.wait()
        self.children.clear()

    # --- the parts --------------------------------------------------------------------------------

    async def start_etcd(self) -> None:
        etcd = self.tool("etcd", "etcd-server", "etcd-client")
        p = self.ports
        peer = f"http://127.0.0.1:{p.etcd_peer}"
        client = f"http://127.0.0.1:{p.etcd}"
        child = self.spawn("etcd", [
            etcd, "--name", "queen-ha", "--data-dir", str(self.state / "etcd"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"queen-ha={peer}", "--initial-cluster-state", "new",
        ])  # fmt: skip

        async def healthy() -> bool:
            async with httpx.AsyncClient(timeout=1) as c:
                return bool((await c.get(f"{client}/health")).json().get("health") == "true")

        await self.until("etcd", healthy, 20, child)

    def node_config(self, i: int, bin_dir: Path) -> dict[str, Any]:
        """deploy/ha/patroni.yml with node ``i``'s loopback addresses, paths and passwords."""
        cfg: dict[str, Any] = yaml.safe_load((HERE / "patroni.yml").read_text())
        p = self.ports
        home = self.state / f"pg{i + 1}"
        cfg["name"] = f"pg{i + 1}"
        cfg["restapi"].update(listen=f"127.0.0.1:{p.rest(i)}", connect_address=f"127.0.0.1:{p.rest(i)}")
        cfg["etcd3"]["hosts"] = f"127.0.0.1:{p.etcd}"
        cfg["bootstrap"]["pg_hba"] = [
            line.replace("10.0.0.0/24", "127.0.0.1/32") for line in cfg["bootstrap"]["pg_hba"]
        ]  # fmt: skip
        pg = cfg["postgresql"]
        pg.update(
            listen=f"127.0.0.1:{p.pg(i)}",
            connect_address=f"127.0.0.1:{p.pg(i)}",
            data_dir=str(home / "data"),
            bin_dir=str(bin_dir),
            pgpass=str(home / "pgpass"),
        )
        pg["authentication"]["superuser"]["password"] = self.secrets["superuser"]
        pg["authentication"]["replication"]["password"] = self.secrets["replication"]
        pg["parameters"]["unix_socket_directories"] = str(home)
        pg["parameters"]["shared_buffers"] = "64MB"  # three servers on one small machine
        return cfg

    async def start_patroni(self) -> None:
        venv = self.patroni_venv()
        pg_bin = find_pg_bin(Path(os.environ["QUEEN_PG_BIN"]) if os.environ.get("QUEEN_PG_BIN") else None)
        if self.account is not None:
            pg_bin = reachable_bin(pg_bin, self.account)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "PATRONI"))}
        t0 = time.monotonic()
        new = not any((self.state / f"pg{i + 1}" / "data").exists() for i in range(NODES))

        async def primary() -> bool:
            return any([await self.rest_ok(i, "/primary") for i in range(NODES)])

        for attempt in (1, 2):
            nodes = []
            for i in range(NODES):
                home = self.state / f"pg{i + 1}"
                home.mkdir(mode=0o700, exist_ok=True)
                cfg_path = self.state / f"pg{i + 1}.yml"
                cfg_path.write_text(yaml.safe_dump(self.node_config(i, pg_bin), sort_keys=False))
                cfg_path.chmod(0o600)
                if self.account is not None:
                    os.chown(home, *self.account)
                    os.chown(cfg_path, *self.account)
                cmd = [str(venv / "bin" / "patroni"), str(cfg_path)]
                nodes.append(self.spawn(f"pg{i + 1}", cmd, env, as_postgres=True))
            try:
                await self.until("a primary", primary, 60 if new and attempt == 1 else 120, *nodes)
                break
            except Fatal:
                if not new or attempt == 2:
                    raise
                # Seen once in many runs: the process Patroni spawns to start PostgreSQL died while
                # importing, and the bootstrap waited for it forever. A new cluster is cheap to redo.
                say("no primary after 60 s (a bootstrap stalled; see the pgN logs): starting the nodes again, empty")
                self.reset_nodes(nodes)
        self.timings["primary_s"] = round(time.monotonic() - t0, 1)
        say(f"a primary is up after {self.timings['primary_s']} s; waiting for both replicas to stream")

        async def synchronous() -> bool:
            members = await self.members()
            roles = sorted(m["role"] for m in members)
            streaming = [m for m in members if m["role"] != "leader" and m["state"] == "streaming"]
            return roles == ["leader", "replica", "sync_standby"] and len(streaming) == NODES - 1

        await self.until("2 streaming replicas, 1 synchronous", synchronous, 180, *nodes)
        self.timings["synchronous_s"] = round(time.monotonic() - t0, 1)

    def reset_nodes(self, nodes: list[Child]) -> None:
        """Stop ``nodes`` (and any PostgreSQL they left running), empty their data directories and
        remove the cluster from etcd: a new bootstrap can start."""
        for c in nodes:
            if c.proc.poll() is None:
                c.proc.send_signal(signal.SIGTERM)
                try:
                    c.proc.wait(30)
                except subprocess.TimeoutExpired:
                    c.proc.kill()
                    c.proc.wait()
            self.children.remove(c)
        for i in range(NODES):
            data = self.state / f"pg{i + 1}" / "data"
            with contextlib.suppress(OSError, ValueError, IndexError):
                pid = int((data / "postmaster.pid").read_text().split()[0])
                if pid > 1 and str(data).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
            shutil.rmtree(data, ignore_errors=True)
        etcdctl = shutil.which("etcdctl") or "etcdctl"
        subprocess.run(
            [etcdctl, f"--endpoints=127.0.0.1:{self.ports.etcd}", "del", "--prefix", "/service/queen/"],
            env=os.environ | {"ETCDCTL_API": "3"}, capture_output=True, check=False,
        )  # fmt: skip

    async def rest_ok(self, i: int, path: str) -> bool:
        async with httpx.AsyncClient(timeout=1) as c:
            return (await c.get(f"http://127.0.0.1:{self.ports.rest(i)}{path}")).status_code == 200

    async def members(self) -> list[dict[str, Any]]:
        for i in range(NODES):
            with contextlib.suppress(Exception):
                async with httpx.AsyncClient(timeout=1) as c:
                    r = await c.get(f"http://127.0.0.1:{self.ports.rest(i)}/cluster")
                    members: list[dict[str, Any]] = r.json()["members"]
                    return members
        return []

    async def create_database(self) -> None:
        """The broker's role and database on the primary (a no-op once they exist)."""
        hosts = ",".join(f"127.0.0.1:{self.ports.pg(i)}" for i in range(NODES))
        url = f"postgresql://postgres:{self.secrets['superuser']}@{hosts}/postgres?target_session_attrs=read-write"
        conn = await asyncpg.connect(url, timeout=10)
        try:
            if not await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = 'queen'"):
                await conn.execute(f"CREATE ROLE queen LOGIN PASSWORD '{self.secrets['queen']}'")
            if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = 'queen'"):
                await conn.execute("CREATE DATABASE queen OWNER queen")
        finally:
            await conn.close()

    def database_url(self) -> str:
        auth = f"queen:{self.secrets['queen']}"
        if self.db_mode == "via-proxy":
            return f"postgresql://{auth}@127.0.0.1:{self.ports.pg_proxy}/queen"
        hosts = ",".join(f"127.0.0.1:{self.ports.pg(i)}" for i in range(NODES))
        return f"postgresql://{auth}@{hosts}/queen?target_session_attrs=read-write"

    async def start_brokers(self) -> None:
        p = self.ports
        peers = ",".join(f"127.0.0.1:{p.mesh(i)}" for i in range(BROKERS))
        base = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_") and k not in ("PORT", "DATABASE_URL")}
        brokers = []
        for i in range(BROKERS):
            env = base | {
                "DATABASE_URL": self.database_url(),
                "PORT": str(p.broker(i)),
                "QUEEN_HOST": "127.0.0.1",
                "QUEEN_WORKERS": str(self.workers),
                "QUEEN_MESH_PORT": str(p.mesh(i)),
                "QUEEN_MESH_PEERS": peers,
                "QUEEN_MESH_SECRET": self.secrets["mesh"],
                "QUEEN_TRUSTED_PROXIES": "127.0.0.1",
                "QUEEN_DB_POOL_SIZE": "10",
            }
            brokers.append(self.spawn(f"broker{i + 1}", [sys.executable, "-m", "queen_pg.cli", "serve"], env))
        for i, b in enumerate(brokers):
            url = f"http://127.0.0.1:{p.broker(i)}/health"

            async def healthy(url: str = url) -> bool:
                async with httpx.AsyncClient(timeout=2) as c:
                    return (await c.get(url)).status_code == 200

            await self.until(f"broker {i + 1}", healthy, 60, b)

    async def start_haproxy(self) -> None:
        exe = self.tool("haproxy", "haproxy")
        p = self.ports
        text = (HERE / "haproxy.cfg").read_text()
        text = text.replace("bind :6632", f"bind 127.0.0.1:{p.front}").replace(
            "bind :5000", f"bind 127.0.0.1:{p.pg_proxy}"
        )
        text = re.sub(
            r"^(\s*)server q1 .*\n(\s*server q\d .*\n)*",
            lambda m: "".join(f"{m.group(1)}server q{i + 1} 127.0.0.1:{p.broker(i)} check\n" for i in range(BROKERS)),
            text,
            flags=re.M,
        )
        text = re.sub(r"^(\s*)server pg1 .*\n(\s*server pg\d .*\n)*", lambda m: "".join(
            f"{m.group(1)}server pg{i + 1} 127.0.0.1:{p.pg(i)} check port {p.rest(i)}\n" for i in range(NODES)),
            text, flags=re.M)  # fmt: skip
        cfg = self.state / "haproxy.cfg"
        cfg.write_text(text)
        check = subprocess.run([exe, "-c", "-q", "-f", str(cfg)], capture_output=True, text=True, check=False)  # noqa: ASYNC221
        if check.returncode != 0:
            sys.exit(f"ha: HAProxy refuses {cfg}:\n{check.stdout}{check.stderr}")
        self.spawn("haproxy", [exe, "-db", "-f", str(cfg)])

    async def front_door(self) -> None:
        child = next(c for c in self.children if c.name == "haproxy")

        async def routes() -> bool:
            async with httpx.AsyncClient(timeout=2) as c:
                return (await c.get(f"http://127.0.0.1:{self.ports.front}/health")).status_code == 200

        await self.until("HAProxy to route to a broker", routes, 30, child)

    # --- the whole ----------------------------------------------------------------------------------

    def prepare(self, fresh: bool) -> None:
        if fresh and self.state.exists():
            say(f"--fresh: removing {self.state}")
            shutil.rmtree(self.state)
        self.state.mkdir(parents=True, exist_ok=True)
        self.state.chmod(0o755)  # the postgres account enters it to reach its node's directory
        (self.state / "logs").mkdir(exist_ok=True)
        secrets_file = self.state / "secrets.json"
        if secrets_file.is_file():
            self.secrets = json.loads(secrets_file.read_text())
        else:
            self.secrets = {k: secrets.token_urlsafe(18) for k in ("superuser", "replication", "queen", "mesh")}
            secrets_file.touch(mode=0o600)
            secrets_file.write_text(json.dumps(self.secrets))

    async def start(self) -> None:
        t0 = time.monotonic()
        await self.start_etcd()
        say(f"etcd on 127.0.0.1:{self.ports.etcd}")
        await self.start_patroni()
        await self.create_database()
        await self.start_haproxy()
        await self.start_brokers()
        await self.front_door()
        self.timings["ready_s"] = round(time.monotonic() - t0, 1)

    async def report(self) -> None:
        p = self.ports
        members = await self.members()
        leader = next((m["name"] for m in members if m["role"] == "leader"), "?")
        venv = (self.venv or self.state / "patroni-venv") / "bin"
        pg_url = f"postgresql://postgres:{self.secrets['superuser']}@127.0.0.1:{p.pg_proxy}/queen"
        replicas = ", ".join(f"127.0.0.1:{p.broker(i)}" for i in range(BROKERS))
        how = "through HAProxy" if self.db_mode == "via-proxy" else "multi-host URL, target_session_attrs=read-write"
        print(
            f"""
queen-pg on highly available PostgreSQL is up ({self.timings["ready_s"]} s; primary after \
{self.timings["primary_s"]} s, synchronous replica after {self.timings["synchronous_s"]} s).

  brokers (HAProxy)  http://127.0.0.1:{p.front}      (replicas: {replicas})
  PostgreSQL primary 127.0.0.1:{p.pg_proxy} (HAProxy, GET /primary on each Patroni); nodes \
{", ".join(f"pg{i + 1} 127.0.0.1:{p.pg(i)}" for i in range(NODES))}; primary now: {leader}
  brokers reach it   {how}
  etcd               http://127.0.0.1:{p.etcd}
  state and logs     {self.state}

  psql on the primary:   psql '{pg_url}'
  cluster state:         {venv}/patronictl -c {self.state}/pg1.yml list
  switchover:            {venv}/patronictl -c {self.state}/pg1.yml switchover --force
  fail a node:           kill -9 the primary's postmaster, or also its Patroni (a dead Patroni is started
                         again after --restart-after s): see deploy/ha/README.md

Ctrl-C stops everything (the data stays; --fresh starts over).""",
            flush=True,
        )
        ready = {
            "front": f"http://127.0.0.1:{p.front}",
            "brokers": [f"http://127.0.0.1:{p.broker(i)}" for i in range(BROKERS)],
            "pg_proxy": p.pg_proxy,
            "patronictl": [str(venv / "patronictl"), "-c", str(self.state / "pg1.yml")],
            "rest": [f"http://127.0.0.1:{p.rest(i)}" for i in range(NODES)],
            "database_url": self.database_url(),
            "timings": self.timings,
        }
        print("ha-ready " + json.dumps(ready), flush=True)


def postgres_account() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam("postgres")
    except KeyError:
        sys.exit("ha: running as root needs a `postgres` account to run PostgreSQL (apt-get install postgresql-common)")
    return pw.pw_uid, pw.pw_gid


def state_dir(wanted: Path | None, account: tuple[int, int] | None) -> Path:
    path = (wanted or REPO / ".queen-ha").resolve()
    if account is None or sh_ok(account, 'cd -- "$1"', path if path.exists() else path.parent):
        return path
    if wanted is not None:
        sys.exit(f"ha: the postgres account cannot enter {path}: choose a --state-dir it can reach")
    say(f"the postgres account cannot enter {path.parent}; keeping the cluster in {FALLBACK_STATE}")
    return FALLBACK_STATE


async def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--state-dir", type=Path, help="where the data, configs and logs go (default ./.queen-ha)")
    ap.add_argument("--fresh", action="store_true", help="remove the state directory first: a new cluster")
    ap.add_argument("--db", choices=("multi-host", "via-proxy"), default="multi-host",
                    help="how brokers reach the primary: a multi-host URL with target_session_attrs=read-write "
                         "(default), or HAProxy's PostgreSQL door")  # fmt: skip
    ap.add_argument("--port", type=int, default=6632, help="HAProxy's door to the brokers (default 6632)")
    ap.add_argument("--base-port", type=int, default=15400, help="first of the cluster's other ports (default 15400)")
    ap.add_argument("--patroni-venv", type=Path, help="Patroni's virtualenv (default: patroni-venv in the state dir)")
    ap.add_argument(
        "--restart-after",
        type=float,
        default=30,
        help="start a Patroni node that died again after this many s (default 30, > ttl; 0: never)",
    )
    ap.add_argument("--workers", type=int, default=1, help="worker processes per broker (default 1)")
    args = ap.parse_args(argv)
    account = postgres_account()
    venv = args.patroni_venv.resolve() if args.patroni_venv else None
    cluster = Cluster(
        state_dir(args.state_dir, account), Ports(args.base_port, args.port), args.db, args.workers, account, venv
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        cluster.prepare(args.fresh)
        starting = asyncio.create_task(cluster.start())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait([starting, stopper], return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            say("stopped during start-up")
            return 130
        stopper.cancel()
        try:
            starting.result()
        except Fatal as exc:
            print(f"ha: {exc}", file=sys.stderr, flush=True)
            return 1
        await cluster.report()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
            cluster.watch(args.restart_after)
        return 0
    finally:
        say("stopping: brokers, HAProxy, Patroni and PostgreSQL, etcd")
        cluster.stop_all()
        say("stopped")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
