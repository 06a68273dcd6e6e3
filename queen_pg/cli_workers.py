"""``queen-pg serve --workers N``: N uvicorn worker processes behind one listening socket.

The parent process (``queen_pg.cli.serve``) has already started the embedded PostgreSQL, if any,
before anything else. Here it applies ``sql/`` once (the workers then skip it), exports every
setting to the environment, where each worker's ``queen_pg.app:app_from_env`` reads them back
(the embedded database's DSN included), sets up prometheus-client's multiprocess directory so
that ``/metrics`` answers for all the workers whichever one is asked, and runs uvicorn's process
supervisor (spawned workers, restarted if one dies).

Every worker runs the background jobs: each tick elects one leader through
``pg_try_advisory_xact_lock`` (docs/locks.md), so N workers do the work once, as N replicas would.
Each worker has its own pool of ``db_pool_size`` connections: N x that in total.

The workers are peers of the wake mesh (``queen_pg/mesh/``): each listens on ``<pid>.sock`` in a
private directory made here (``mesh_local_dir``) and dials its siblings', so a push served by one
worker wakes the pops parked on another at once. With ``mesh_port`` set they also share that TCP
port (SO_REUSEPORT) and relay what a remote replica tells one of them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from collections.abc import MutableMapping
from pathlib import Path

import orjson
from pydantic import AliasChoices

from queen_pg.metrics import MULTIPROC_ENV
from queen_pg.settings import Settings

APP_FACTORY = "queen_pg.app:app_from_env"


def env_names(field: str) -> list[str]:
    """Every environment variable that sets ``field`` (its aliases, else ``QUEEN_<FIELD>``)."""
    alias = Settings.model_fields[field].validation_alias
    if isinstance(alias, AliasChoices):
        return [a for a in alias.choices if isinstance(a, str)]
    if isinstance(alias, str):
        return [alias]
    return [f"QUEEN_{field.upper()}"]


def export_settings(settings: Settings, environ: MutableMapping[str, str]) -> None:
    """Write ``settings`` into ``environ`` so that ``Settings()`` in a worker reads them back
    exactly; a field that is None is removed, so a stale variable cannot come back."""
    data = settings.model_dump(mode="json")
    for field in Settings.model_fields:
        value = data[field]
        for name in env_names(field):
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value if isinstance(value, str) else orjson.dumps(value).decode()


async def _apply_schema_once(url: str) -> None:
    from queen_pg.db.pool import Database

    db = Database(url, 2)
    await db.open(apply_schema=True)
    await db.close()


def serve_workers(settings: Settings) -> int:
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

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
        supervisor = Multiprocess(config, sockets=[config.bind_socket()])
        print(f"queen-pg: {settings.workers} workers on {settings.host}:{settings.port}", flush=True)
        supervisor.run()  # until SIGTERM/SIGINT; SIGHUP restarts the workers one by one
        if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes):
            print("queen-pg: a worker failed to start (see the log above)", file=sys.stderr, flush=True)
            return 1
        return 0
    finally:
        if mesh_dir is not None:
            shutil.rmtree(mesh_dir, ignore_errors=True)
        if own_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)
            os.environ.pop(MULTIPROC_ENV, None)
