"""Settings: one pydantic-settings class, read from the environment and validated at boot.

Every option of ``queen-pg serve`` maps to one field here and to one environment variable;
the CLI only overrides fields. Nothing happens at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, AliasGenerator, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from queen_pg.setting_values import key_problem, parse_keys, parse_peers

MIB = 1024 * 1024


def _reference_name(field: str) -> str | None:
    """The environment variable of a ``jwt_*`` setting: its name upper-cased, without QUEEN_, as the 0.x
    reference names them (JWT_SECRET, ...); None leaves every other field to env_prefix or its own alias."""
    return field.upper() if field.startswith("jwt_") else None


class Settings(BaseSettings):
    """Broker configuration. Field docs are the README's settings table."""

    model_config = SettingsConfigDict(
        env_prefix="QUEEN_",
        extra="ignore",
        populate_by_name=True,
        # pydantic leaves a field whose generated alias is None as it is; its stub does not say None
        alias_generator=AliasGenerator(validation_alias=_reference_name),  # type: ignore[arg-type]
    )

    host: str = Field(
        "127.0.0.1",
        description="Address the HTTP server binds to; loopback by default (set 0.0.0.0 behind a proxy or in "
        "a container, with JWT or a network boundary in front).",
    )
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
    pop_cache_mb: int = Field(
        8,
        ge=0,
        le=4096,
        description="Decoded segments kept per worker (MiB, LRU) so consumer groups reading the same messages "
        "decode them once (fan-out); 0 = off. Encrypted payloads stay sealed in it. Groups that read close "
        "together need little (make bench's fan-out: 96 % hits at 8, 97 % at 32); raise it for groups far "
        "apart. Each MiB costs about 1 MiB of RSS when full.",
    )
    malloc_trim_s: float = Field(
        10.0,
        ge=0,
        le=3600,
        description="Every this many seconds a worker whose heap grew gives its free pages back to the system "
        "(glibc malloc_trim), so its RSS comes down after a burst; 0 = never.",
    )
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="Largest accepted request body.")
    max_decoded_bytes: int | None = Field(
        None,
        ge=1024,
        description="Most bytes one request may expand to when the broker decodes it (zstd and base64 timer "
        "payloads, zstd binary pushes and transactions), summed over the request and charged to the admission "
        "budget before they are produced; beyond it 413 decoded_too_large. Unset: max_body_bytes.",
    )
    max_batch: int = Field(10_000, ge=1, description="Largest pop batch a request may ask for.")
    max_items: int = Field(
        10_000,
        ge=1,
        description="Most items one request may carry: the messages of a push (JSON or binary), the "
        "acknowledgments of /ack/batch, the acks, pushed messages, KV and timer operations of a transaction "
        "together (JSON or binary). Counted before any item is built; beyond it 413 too_many_items, nothing "
        "written. Keep it at least max_batch, so a full pop can be acknowledged in one /ack/batch.",
    )
    max_answer_bytes: int = Field(
        32 * MIB,
        ge=64 * 1024,
        description="Answer budget of the reads that gather many items: a page of /kv/keys, /messages, /dlq "
        "or /traces stops when it reaches it (truncated, with nextAfter or nextOffset; at least one item), a "
        "/kv batch or a transaction whose KV reads would answer more is 413 answer_too_large. Keep it above "
        "1 MiB (the largest KV value) for a lone /kv get to always fit.",
    )
    pop_poll_interval_ms: int = Field(
        1000, ge=10, le=60_000, description="A parked long-poll pop re-checks the database this often."
    )
    pop_poll_max_ms: int = Field(
        10_000,
        ge=10,
        le=600_000,
        description="A parked pop's database re-check is a safety net (wakes come from pushes, the mesh and "
        "lease expiry): it backs off from pop_poll_interval_ms to this, jittered, and one re-check serves "
        "every pop parked on the same queue, group and partition.",
    )
    max_waiters: int = Field(10_000, ge=1, description="Most long-poll pops parked at once per worker.")
    waiters_tenant_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="With tenancy on: the most of max_waiters one tenant's long-poll pops may hold parked (at "
        "least one), so one tenant parking all it can leaves room for the others; 1 = no per-tenant share.",
    )
    default_tenant: str = Field("default", min_length=1, description="Tenant of every request.")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="uvicorn worker processes of `queen-pg serve`; the embedded PostgreSQL and the schema "
        "apply happen once, in the parent, before the workers start. Each worker has its own pool "
        "(db_pool_size connections) and runs the jobs (one leader per tick).",
    )
    jobs_enabled: bool = Field(
        True,
        description="Run the background jobs (lease expiry, retention, DLQ payload fill) in this process; "
        "0 for tests or replicas that only serve. Replicas that run them share the work (one per tick).",
    )

    # the HTTP server (queen_pg/server.py)
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        le=600,
        description="A connection whose request head has not fully arrived this many seconds after its first "
        "byte (or after it was accepted) is answered 408 and closed.",
    )
    body_idle_timeout_s: float = Field(
        30.0,
        gt=0,
        le=600,
        description="A request whose body stops arriving (no byte for this many seconds while the broker is "
        "ready to read) is answered 408 and closed, so it holds no admission bytes or connection for good.",
    )
    max_connections: int = Field(
        10_000,
        ge=1,
        description="Open HTTP connections per process (parked long-polls included). A connection beyond it "
        "takes the place of the oldest one that has no request in flight and has never had a request admitted "
        "(with JWT on: with a valid token), which is answered 503 + Retry-After and closed; with none such, the "
        "newcomer is answered so. Lowered, with a warning, to what the file-descriptor limit allows.",
    )
    max_head_bytes: int = Field(
        64 * 1024,
        ge=4096,
        le=16 * MIB,
        description="The most bytes a request head (request line and headers) may take; a head that grows past "
        "it is answered 431 `head_too_large` and its connection closed, before the bytes reach the HTTP parser.",
    )
    hot_protocol: bool = Field(
        True,
        description="The data plane's routes (push, pop, ack, ack/batch, lease extend, transaction) are answered "
        "from the HTTP protocol itself, past uvicorn's ASGI cycle and the middleware chain, with the same checks "
        "(queen_pg/api/hot.py); 0 sends them through the ASGI app like every other route.",
    )
    keep_alive_s: int = Field(
        75,
        ge=1,
        le=3600,
        description="An idle keep-alive connection is closed after this many seconds. Keep it above your proxy's "
        "idle timeout for its server connections: when the broker closes one the proxy is sending on, that "
        "request fails.",
    )
    gc_thresholds: str = Field(
        "10000,10,100",
        pattern=r"^(\d+,\d+,\d+)?$",
        description="Garbage-collector thresholds of a `queen-pg serve` process (gen0,gen1,gen2; empty: "
        "Python's 700,10,10), applied with a freeze of the start-up objects. A parked long-poll holds ~200 "
        "objects; with Python's defaults 2,000 of them made the full collections cost most of an idle broker's "
        "CPU and pause it 0.1-0.6 s every few seconds.",
    )
    drain_delay_ms: int = Field(
        1000,
        ge=0,
        le=60_000,
        description="On SIGTERM /health answers 503 `draining` and responses close their connections for this "
        "long before the listener closes, so a proxy's health check takes the replica out first (keep it above "
        "the check's interval x fall). 0, SIGINT or a second SIGTERM 2 s or more after the first: no wait.",
    )
    shutdown_grace_s: int = Field(
        8,
        ge=1,
        le=3600,
        description="On SIGTERM parked long-poll pops answer 204 at once; requests in flight get this many "
        "seconds to finish before they are cancelled (below a container's stop timeout, 10 s by default).",
    )

    # operations (queen_pg/api/status/system.py, queen_pg/jobs/maintenance.py, stats.py, traces.py)
    maintenance_refresh_ms: int = Field(
        500,
        ge=50,
        le=1000,
        description="Each process re-reads the maintenance switches from the database this often (at most 1 s).",
    )
    stats_retention_hours: int = Field(
        168, ge=0, description="Per-minute throughput/lag rows (status, analytics) are kept this long; 0 = forever."
    )
    stats_snapshot_interval_s: float = Field(
        5.0,
        ge=0.5,
        le=3600,
        description="The counts of /api/v1/status, /api/v1/resources/overview and /metrics are recomputed this "
        "often (their asOf); each pass reads every row of the tenant once.",
    )
    trace_retention_hours: int = Field(
        168, ge=0, description="Trace events (POST /api/v1/traces) are kept this long; 0 = forever."
    )

    # overload (queen_pg/limiter.py, queen_pg/api/shared/admission.py, queen_pg/jobs/storage.py)
    admit_max_mb: int = Field(
        256,
        ge=1,
        description="Admission budget in MiB: pushes and transactions take permits sized by their "
        "Content-Length before their body is read; at least 2 x max_body_bytes (128 MiB by default).",
    )
    admit_hold_ms: int = Field(
        15_000,
        ge=1,
        le=600_000,
        description="A push waits this long (jittered +-20 %) for admission or a limiter permit, then 429.",
    )
    admit_tenant_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="With tenancy on: the most of the admission budget one tenant's pushes and transactions "
        "may hold or wait for (at least one largest body), so one tenant's flood cannot starve another; "
        "1 = no per-tenant share.",
    )
    limiter_initial: int = Field(64, ge=1, description="Starting concurrency limit of each route family.")
    limiter_min: int = Field(32, ge=1, description="Lowest concurrency limit the Vegas limiter may set.")
    limiter_max: int = Field(1000, ge=1, description="Highest concurrency limit the Vegas limiter may set.")
    limiter_queue: int = Field(
        10_000, ge=0, description="Requests waiting for a permit per route family; beyond it 429 at once."
    )
    disk_high_pct: float = Field(
        85.0,
        gt=0,
        le=100,
        description="Pushes are refused (507 storage_full) while the database's disk is fuller than this.",
    )
    disk_path: Path | None = Field(
        None,
        description="Filesystem measured against disk_high_pct; queen-pg serve sets it to the embedded "
        "PostgreSQL's data directory. Unset with an external database: use db_max_bytes.",
    )
    db_max_bytes: int = Field(
        0,
        ge=0,
        description="Byte budget of an external database: pushes are refused (507 storage_full) while "
        "pg_database_size() is larger; 0 = no check.",
    )
    storage_check_ms: int = Field(
        5000, ge=100, le=600_000, description="How often the storage check (disk / database size) is refreshed."
    )

    # request fusion (queen_pg/engine/fusion.py) and the outcome window (sql/procedures/096_outcomes.sql)
    fuse_hold_us: int = Field(
        2000,
        ge=0,
        le=1_000_000,
        description="Longest a push or ack waits to be fused with concurrent ones into one procedure call "
        "(microseconds); 0 disables fusion.",
    )
    fuse_max_items: int = Field(
        1000, ge=1, le=100_000, description="A fused batch leaves at once when it holds this many items."
    )
    fuse_inflight: int = Field(
        1,
        ge=0,
        le=1000,
        description="Calls of one family (push, ack) running at once before new requests wait to be fused "
        "(natural batching); 0 = always wait fuse_hold_us.",
    )
    fuse_max_calls: int = Field(
        2,
        ge=1,
        le=1000,
        description="Calls of one family (push, ack) running at most at once per tenant and worker: a batch "
        "whose hold is over waits for one of them to return, gathering more requests, instead of adding a "
        "call that would contend with the running ones for the same rows.",
    )
    fuse_pops: bool = Field(
        True,
        description="Pops of different consumer groups on one queue that arrive together (woken by the same "
        "push) share one procedure call (queen.pop_many_v1), each answered as alone; needs fuse_hold_us > 0.",
    )
    request_id_window_s: int = Field(
        60,
        ge=1,
        le=86_400,
        description="A request carrying Idempotency-Key (or X-Request-Id) answered within this many seconds "
        "gets the recorded outcome again instead of being applied twice.",
    )

    # security (queen_pg/security/): each jwt_* field is read from the 0.x reference's name (_reference_name)
    jwt_enabled: bool = Field(False, description="Require a JWT on every route.")
    jwt_algorithm: Literal["HS256", "RS256", "EdDSA", "auto"] = Field(
        "HS256",
        description="HS256, RS256, EdDSA, or auto (by the token's header among the keys configured); never none.",
    )
    jwt_secret: str = Field("", description="HS256 shared secret.")
    jwt_public_key: str = Field("", description="PEM public key for RS256 / EdDSA.")
    jwt_jwks_url: str = Field(
        "", description="JWKS document URL (RS256 / EdDSA keys by kid); cached, refreshed, a kid miss refreshes once."
    )
    jwt_jwks_refresh_interval: int = Field(3600, ge=1, description="Seconds between JWKS refreshes.")
    jwt_jwks_timeout_ms: int = Field(5000, ge=1, description="Timeout of one JWKS fetch (ms).")
    jwt_issuer: str = Field("", description="Required `iss` (empty: any).")
    jwt_audience: str = Field("", description="Required `aud` (empty: any).")
    jwt_clock_skew: int = Field(30, ge=0, description="Seconds of leeway on exp / nbf / iat.")
    jwt_require_exp: bool = Field(
        True,
        description="Refuse a token without `exp` (401); off: such a token is valid until its key changes "
        "(re-verified every 300 s). An `exp` that is not a JSON number is refused either way.",
    )
    jwt_skip_paths: str = Field(
        "/health,/metrics/prometheus,/metrics,/", description="Comma-separated exact paths answered without a token."
    )
    jwt_roles_claim: str = Field("role", description="Claim with one role.")
    jwt_roles_array_claim: str = Field("roles", description="Claim with a list of roles.")
    jwt_role_admin: str = Field("admin", description="Role name: admin.")
    jwt_role_read_write: str = Field("read-write", description="Role name: read-write.")
    jwt_role_read_only: str = Field("read-only", description="Role name: read-only.")
    jwt_tenant_claim: str = Field(
        "", description="With tenancy_header and JWT on: the claim naming the tenant (wins over x-queen-tenant)."
    )
    tenancy_header: bool = Field(
        False, description="Tenant from the x-queen-tenant header (or JWT_TENANT_CLAIM); off: default_tenant."
    )
    allowed_hosts: str = Field(
        "",
        description="Comma-separated Host values accepted (name, name:port, *.suffix; * = any); others 400 "
        "bad_host (DNS rebinding). Empty: loopback names (localhost, *.localhost, 127.0.0.1, [::1]) and the "
        "bind address; bound to 0.0.0.0 or :: also IP addresses, single-label names and the machine's hostname "
        "(logged at start as event=allowed_hosts_default).",
    )
    cors_origins: str = Field(
        "",
        description="Comma-separated origins allowed by CORS (* = any); empty: no CORS. These origins may also "
        "send state-changing requests cross-site, which are otherwise 403 cross_site.",
    )
    encryption_key: str = Field(
        "",
        repr=False,
        description="64 hex characters (AES-256): seals the payloads of queues configured with "
        "encryptionEnabled. Empty: the embedded default (no DATABASE_URL) generates one once into "
        "<data_dir>/encryption_key (0600); with DATABASE_URL encrypted queues are refused (409 "
        "encryption_key_missing). A configured key wins; a generated file's key then stays readable as an old key.",
    )
    encryption_keys_old: str = Field(
        "",
        repr=False,
        description="Comma-separated earlier keys (64 hex each): still decrypt what they sealed after a rotation.",
    )
    encryption_seal_version: int = Field(
        2,
        ge=1,
        le=2,
        description="The sealed format new payloads are written in: 2 binds each payload to its tenant, queue "
        "and partition (a copy elsewhere does not open); 1 only during a rolling upgrade from a release that "
        "cannot open version 2. Both are always read.",
    )

    # the wake mesh (queen_pg/mesh/) and the proxy in front (deploy/)
    mesh_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="TCP port of the wake mesh (replicas tell each other about pushes, maintenance flips and "
        "queue-config changes); unset = no mesh listener.",
    )
    mesh_bind: str = Field("127.0.0.1", description="Address the mesh listens on (loopback by default).")
    mesh_peers: str = Field(
        "",
        description="The other replicas' mesh addresses, comma-separated host:port (listing this replica "
        "too is fine: it notices and skips itself).",
    )
    mesh_secret: str = Field(
        "",
        description="Shared secret: every mesh frame carries an HMAC-SHA256 with it; frames that fail are "
        "dropped and counted. Required when the mesh listens beyond loopback or has peers beyond it.",
    )
    mesh_outbox: int = Field(
        1024, ge=1, le=1_000_000, description="Mesh frames queued per peer; beyond it frames to that peer are dropped."
    )
    mesh_max_pending: int = Field(
        16,
        ge=1,
        le=4096,
        description="Inbound mesh connections held before their signed HELLO; a new one closes the oldest, so "
        "connections without the secret never take an authenticated peer's place (64 per process).",
    )
    mesh_idle_timeout_s: float = Field(
        30.0,
        ge=1.0,
        le=3600.0,
        description="An authenticated inbound mesh connection that carries nothing for this long is closed "
        "(a half-open one frees its place); the dialling replica sends a ping a third of it apart when idle.",
    )
    mesh_local_dir: Path | None = Field(
        None,
        description="Directory of the Unix sockets through which the workers of one host wake each other; "
        "`queen-pg serve --workers N` sets it.",
    )
    trusted_proxies: str = Field(
        "",
        description="Comma-separated addresses/CIDRs of reverse proxies whose X-Forwarded-For/-Proto are "
        "believed (for logs and metrics only, never for authorisation).",
    )

    @classmethod
    def env_names(cls, field: str) -> list[str]:
        """Every environment variable that sets ``field``: its aliases, else env_prefix + FIELD."""
        alias = cls.model_fields[field].validation_alias
        if isinstance(alias, AliasChoices):
            return [a for a in alias.choices if isinstance(a, str)]
        if isinstance(alias, str):
            return [alias]
        return [f"{cls.model_config['env_prefix']}{field.upper()}"]

    @model_validator(mode="after")
    def _mesh(self) -> Settings:
        from ipaddress import ip_address

        peers = parse_peers(self.mesh_peers)
        if peers and self.mesh_port is None:
            raise ValueError("mesh_peers needs mesh_port: a replica must listen to be woken")
        if self.mesh_port is not None and not self.mesh_secret:

            def loopback(host: str) -> bool:
                if host == "localhost":
                    return True
                try:
                    return ip_address(host).is_loopback
                except ValueError:
                    return False

            if not loopback(self.mesh_bind) or not all(loopback(h) for h, _ in peers):
                raise ValueError("mesh_secret is required when the mesh listens or dials beyond loopback")
        return self

    @property
    def decoded_cap(self) -> int:
        """The per-request total of decoded bytes (``max_decoded_bytes``, by default ``max_body_bytes``)."""
        return self.max_body_bytes if self.max_decoded_bytes is None else self.max_decoded_bytes

    @model_validator(mode="after")
    def _overload(self) -> Settings:
        if self.limiter_min > self.limiter_max:
            raise ValueError(f"limiter_min ({self.limiter_min}) exceeds limiter_max ({self.limiter_max})")
        if self.admit_max_mb * MIB < 2 * self.max_body_bytes:
            raise ValueError(
                f"admit_max_mb ({self.admit_max_mb} MiB) must hold two of the largest bodies: "
                f"at least 2 x max_body_bytes = {-(-2 * self.max_body_bytes // MIB)} MiB"
            )
        if self.admit_max_mb * MIB < self.max_body_bytes + self.decoded_cap:
            raise ValueError(
                f"admit_max_mb ({self.admit_max_mb} MiB) must hold the largest body and what it may decode to: "
                f"at least max_body_bytes + max_decoded_bytes = "
                f"{-(-(self.max_body_bytes + self.decoded_cap) // MIB)} MiB"
            )
        return self

    @model_validator(mode="after")
    def _encryption(self) -> Settings:
        """A malformed key refuses to start (the message names the setting, never the value)."""
        parse_keys(self.encryption_key, self.encryption_keys_old)
        return self

    @model_validator(mode="after")
    def _jwt(self) -> Settings:
        """JWT on without a usable key refuses to start (queen_pg/setting_values.py says which)."""
        if self.jwt_enabled:
            problem = key_problem(self)
            if problem:
                raise ValueError(problem)
        return self

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, v: object) -> object:
        return v.lower() if isinstance(v, str) else v
