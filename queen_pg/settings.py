"""Settings: one pydantic-settings class, read from the environment and validated at boot.

Every option of ``queen-pg serve`` maps to one field here and to one environment variable;
the CLI only overrides fields. Nothing happens at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Broker configuration. Field docs are the README's settings table."""

    model_config = SettingsConfigDict(env_prefix="QUEEN_", extra="ignore", populate_by_name=True)

    host: str = Field("0.0.0.0", description="Address the HTTP server binds to.")
    port: int = Field(
        6632,
        ge=0,
        le=65535,
        validation_alias=AliasChoices("PORT", "QUEEN_PORT"),
        description="HTTP port (PORT or QUEEN_PORT).",
    )
    database_url: str | None = Field(
        None,
        validation_alias=AliasChoices("DATABASE_URL", "QUEEN_DATABASE_URL"),
        description="PostgreSQL URL; when unset an embedded PostgreSQL is started in data_dir.",
    )
    data_dir: Path = Field(Path(".queen"), description="Directory of the embedded PostgreSQL.")
    pg_port: int = Field(
        54329,
        ge=1,
        le=65535,
        description="Port of the embedded PostgreSQL (names its Unix socket; TCP only with pg_tcp).",
    )
    pg_tcp: bool = Field(False, description="Embedded PostgreSQL also listens on 127.0.0.1:pg_port.")
    pg_bin: Path | None = Field(None, description="Directory with PostgreSQL server binaries to use.")
    apply_schema: bool = Field(True, description="Apply sql/ at boot (0 for a low-privilege role).")
    db_pool_size: int = Field(
        20,
        ge=2,
        le=1000,
        validation_alias=AliasChoices("DB_POOL_SIZE", "QUEEN_DB_POOL_SIZE"),
        description="Connections in the asyncpg pool of each worker.",
    )
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="Largest accepted request body.")
    max_batch: int = Field(10_000, ge=1, description="Largest pop batch a request may ask for.")
    pop_poll_interval_ms: int = Field(
        1000, ge=10, le=60_000, description="A parked long-poll pop re-checks the database this often."
    )
    max_waiters: int = Field(10_000, ge=1, description="Most long-poll pops parked at once per worker.")
    default_tenant: str = Field("default", min_length=1, description="Tenant of every request.")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    jobs_enabled: bool = Field(
        True,
        description="Run the background jobs (lease expiry, retention, DLQ payload fill) in this process; "
        "0 for tests or replicas that only serve. Replicas that run them share the work (one per tick).",
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, v: object) -> object:
        return v.lower() if isinstance(v, str) else v
