"""Test fixtures: a real PostgreSQL (the broker's own embedded launcher, or TEST_DATABASE_URL), a fresh
database per test cloned from a template that already holds sql/, and a real uvicorn server on a free
port for HTTP behaviour."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import psycopg
import pytest
import uvicorn

from queen_pg.app import create_app
from queen_pg.db.apply import apply_sql
from queen_pg.db.pool import Database
from queen_pg.embedded_pg import EmbeddedPostgres
from queen_pg.server import uvicorn_config
from queen_pg.settings import Settings
from tests.helpers import eventually

TEMPLATE = "queen_template"
_counter = itertools.count()


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


@dataclass
class PgServer:
    admin_url: str  # a URL to a maintenance database (postgres)
    embedded: EmbeddedPostgres | None

    def url(self, name: str) -> str:
        return with_database(self.admin_url, name)


def searchable(path: Path) -> Path:
    """pytest makes its temp dirs 0700; let the `postgres` account (the embedded server runs as it when
    we are root) traverse them, search-only, from /tmp down to ``path``."""
    for d in [*reversed(path.parents), path]:
        if str(d).startswith(tempfile.gettempdir() + "/") and d.owner() == "root" and d.is_dir():
            d.chmod(d.stat().st_mode | 0o011)
    return path


@pytest.fixture
def tmp_path(tmp_path: Path) -> Path:
    return searchable(tmp_path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    external = os.environ.get("TEST_DATABASE_URL")
    if external:
        server = PgServer(admin_url=external, embedded=None)
        _make_template(server)
        yield server
        return
    pg = EmbeddedPostgres(data_dir=searchable(tmp_path_factory.mktemp("pg")), port=free_port(), fast=True)
    pg.start()
    try:
        server = PgServer(admin_url=pg.admin_dsn("postgres"), embedded=pg)
        _make_template(server)
        yield server
    finally:
        pg.stop()


def _make_template(server: PgServer) -> None:
    with psycopg.connect(server.admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {TEMPLATE}")

    async def apply() -> None:
        c = await asyncpg.connect(server.url(TEMPLATE))
        try:
            await apply_sql(c)
        finally:
            await c.close()

    asyncio.run(apply())


def fresh_database(server: PgServer, template: str = TEMPLATE) -> str:
    name = f"t_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(server.admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {template} STRATEGY FILE_COPY")
    return server.url(name)


def empty_database(server: PgServer) -> str:
    return fresh_database(server, template="template0")


@pytest.fixture
def db_url(pg_server: PgServer) -> str:
    """A fresh database holding the schema."""
    return fresh_database(pg_server)


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    """The broker's own pool class on the fresh database, for engine- and job-level tests."""
    d = Database(db_url, 8)
    await d.open(apply_schema=False)
    yield d
    await d.close()


@pytest.fixture
async def conn(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(db_url)
    try:
        yield c
    finally:
        await c.close()


class Broker:
    """A real uvicorn server running create_app(settings) on a free port in this event loop."""

    def __init__(self, settings: Settings, bind: str = "127.0.0.1", **server: Any) -> None:
        self.settings = settings
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((bind, 0))
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://{bind}:{self.port}"
        self.app = create_app(settings)
        config = uvicorn_config(self.app, settings, log_level="warning", lifespan="on", **server)  # as `serve` runs it
        self.server = uvicorn.Server(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        task = self._task = asyncio.create_task(self.server.serve(sockets=[self.sock]))

        def up() -> bool:
            if task.done():
                task.result()
                raise RuntimeError("broker exited during start-up")
            return bool(self.server.started)

        await eventually(up, "the broker to start", within=30)

    async def stop(self) -> None:
        self.server.should_exit = True
        if self._task is not None:
            await self._task
        self.sock.close()


def broker_settings(db_url: str, **overrides: Any) -> Settings:
    return Settings(**{"database_url": db_url, "db_pool_size": 5, **overrides})


@pytest.fixture
async def start_broker(db_url: str) -> AsyncIterator[Any]:
    started: list[Broker] = []

    async def start(url: str | None = None, server: dict[str, Any] | None = None, **overrides: Any) -> Broker:
        """A broker on ``url`` (default: the test's database) with these settings (and uvicorn ``server``
        options), stopped at the end of the test."""
        b = Broker(broker_settings(url or db_url, **overrides), **(server or {}))
        await b.start()
        started.append(b)
        return b

    yield start
    for b in started:
        await b.stop()


@pytest.fixture
async def broker(start_broker: Any) -> Broker:
    b: Broker = await start_broker()
    return b


@pytest.fixture
async def http(broker: Broker) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as client:
        yield client


ROOT = Path(__file__).resolve().parent.parent
