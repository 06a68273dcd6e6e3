"""Queue management and health (docs/wire.md#configure, docs/wire.md#admin)."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg import __version__
from queen_pg.api.admin.schemas import ConfigureAnswer, DeleteQueueAnswer, HealthAnswer
from queen_pg.api.shared import raw_fields
from queen_pg.api.shared.body import INT32, Name, decode, stored_json
from queen_pg.api.shared.common import check_name, json_response, state, tenant
from queen_pg.api.shared.docs import answers, body
from queen_pg.engine import queues as queue_engine
from queen_pg.engine import sealing
from queen_pg.errors import DRAINING, QueenError, bad_request
from queen_pg.security import crypto
from queen_pg.security.access import level, reaches
from queen_pg.security.roles import Level

router = APIRouter()

# Ranges of the known options: each is an `integer` column of queen.queues (sql/schema.sql).
OPTION_RANGES: dict[str, tuple[int, int]] = {
    "leaseTime": (1, 7 * 86400),
    "retryLimit": (0, 1_000_000),
    "priority": (-INT32 - 1, INT32),
    "delayedProcessing": (0, INT32),
    "windowBuffer": (0, INT32),
    "maxSize": (0, INT32),
    "retentionSeconds": (0, INT32),
    "completedRetentionSeconds": (0, INT32),
    "dedupWindowSeconds": (0, INT32),
}


LeaseTime = Annotated[int, msgspec.Meta(ge=OPTION_RANGES["leaseTime"][0], le=OPTION_RANGES["leaseTime"][1])]
RetryLimit = Annotated[int, msgspec.Meta(ge=OPTION_RANGES["retryLimit"][0], le=OPTION_RANGES["retryLimit"][1])]
Priority = Annotated[int, msgspec.Meta(ge=OPTION_RANGES["priority"][0], le=OPTION_RANGES["priority"][1])]
Seconds = Annotated[int, msgspec.Meta(ge=0, le=INT32)]  # every other option: OPTION_RANGES says (0, INT32)


class QueueOptions(msgspec.Struct):
    """Known options are type- and range-checked; unknown keys are kept as given (any JSON value that
    can be stored exactly: integers within 64 bits, no U+0000)."""

    leaseTime: LeaseTime | None = None
    retryLimit: RetryLimit | None = None
    priority: Priority | None = None
    delayedProcessing: Seconds | None = None
    windowBuffer: Seconds | None = None
    maxSize: Seconds | None = None
    retentionSeconds: Seconds | None = None
    completedRetentionSeconds: Seconds | None = None
    dedupWindowSeconds: Seconds | None = None
    encryptionEnabled: (
        Annotated[
            bool,
            msgspec.Meta(
                description="seal the queue's payloads at rest (AES-256-GCM); true needs QUEEN_ENCRYPTION_KEY "
                "(409 encryption_key_missing; the embedded default generates one)"
            ),
        ]
        | None
    ) = None


class ConfigureBody(msgspec.Struct):
    queue: Name
    namespace: Name | None = None
    task: Name | None = None
    options: QueueOptions | None = None


def _configure_body(raw: bytes) -> tuple[ConfigureBody, dict[str, Any]]:
    """The body and its options as given (unknown keys included, nulls dropped); a known option out of
    its range is a 400 that names the range."""
    try:
        parsed = decode(raw, ConfigureBody)
    except QueenError as err:
        where = str(err).partition(":")[0]
        name = where.removeprefix("options.")
        if name in OPTION_RANGES:
            lo, hi = OPTION_RANGES[name]
            raise bad_request(f"{err}; options.{name} must be an integer from {lo} to {hi}") from None
        raise
    given = decode(raw, _GivenOptions).options or {}  # a big body's unknown options: raw_fields.Prepared
    known = msgspec.structs.asdict(parsed.options) if parsed.options is not None else {}
    options = {k: known.get(k, _fragment(v)) for k, v in given.items() if v is not None and not _null(v)}
    stored_json(options, "options")  # known ones as decoded (5.0 -> 5)
    return parsed, options


class _GivenOptions(msgspec.Struct):
    """The options as given: unknown ones are free-form (api/shared/raw_fields.py in a big body)."""

    options: dict[str, Any] | None = None


def _null(v: Any) -> bool:
    return isinstance(v, raw_fields.Prepared) and v.encoded == b"null"


def _fragment(v: Any) -> Any:
    """A big body's option as orjson writes it into the stored options (a refusal: stored_json's)."""
    if not isinstance(v, raw_fields.Prepared):
        return v
    if v.encoded is None:
        raise bad_request(
            f"options cannot be stored exactly ({v.failure}): integers must fit in 64 bits, nesting in 254 levels"
        )
    return orjson.Fragment(v.encoded)


@router.post(
    "/api/v1/configure",
    summary="Create or configure a queue (docs/wire.md#configure)",
    description="Known options are type- and range-checked (a 400 names the range), unknown ones kept as given; "
    "encryptionEnabled=true needs QUEEN_ENCRYPTION_KEY on this broker (409 encryption_key_missing); the embedded "
    "default (no DATABASE_URL) generates one into its data directory. With JWT on, weakening an existing queue "
    "(encryptionEnabled true to false, a shorter dedupWindowSeconds) needs the admin level (403 forbidden).",
    openapi_extra=body(ConfigureBody),
    responses=answers({200: ConfigureAnswer}, 400, 403, 413),
)
@level(Level.READ_WRITE)
async def configure(request: Request) -> Response:
    raw = await request.body()
    if not raw.strip():
        raise bad_request("request body is empty; a JSON object is required")
    body, options = _configure_body(raw)
    check_name("queue", body.queue)
    if body.namespace is not None:
        check_name("namespace", body.namespace)
    if body.task is not None:
        check_name("task", body.task)
    st = state(request)
    sealing.may_configure(st.db, options)  # encryptionEnabled without a key: 409 before any write
    # weakening an existing queue (encryption off, a shorter dedup window) needs admin: the procedure
    # decides against the stored options under the queue row lock
    may_weaken = reaches(request, Level.ADMIN)
    result = await queue_engine.configure(
        st.db, tenant(request), body.queue, body.namespace, body.task, options, may_weaken=may_weaken
    )
    crypto.vault(st.db).learn(tenant(request), body.queue, bool(result["options"]["encryptionEnabled"]))
    st.waiters.wake(tenant(request), body.queue)  # new options (a shorter delay, ...) may free messages
    if st.mesh is not None:
        st.mesh.publish_config(tenant(request), body.queue)
    return json_response({"success": True, "queue": body.queue, **result, "configured": True})


@router.delete(
    "/api/v1/resources/queues/{queue}",
    summary="Delete a queue and all it holds",
    description="An unknown queue is 200 with `deleted: false`.",
    responses=answers({200: DeleteQueueAnswer}, 400, 413),
)
@level(Level.ADMIN)
async def delete_queue(request: Request, queue: str) -> Response:
    check_name("queue", queue)
    st = state(request)
    deleted = await queue_engine.delete(st.db, tenant(request), queue)
    return json_response({"success": True, "queue": queue, "deleted": deleted})


@router.get(
    "/health",
    summary="Liveness: 200 when the database answers, 503 when not or when the replica is draining",
    description="The 503 body also carries `status: unhealthy`, `database: down` (or `read-only`: it answers "
    "but refuses writes, a standby) and `version`; after SIGTERM "
    "(the drain delay) it is `status: draining`, `code: draining`.",
    responses=answers({200: HealthAnswer}),
)
@level(Level.READ_ONLY)
async def health(request: Request) -> Response:
    st = state(request)
    if st.transport is not None and st.transport.draining:  # the proxy takes this replica out now
        err = QueenError(DRAINING)
        return json_response({**err.body(), "status": "draining", "version": __version__}, err.status)
    database = await st.db.state()
    ok = database == "up"
    body = {"status": "healthy" if ok else "unhealthy", "database": database, "version": __version__}
    if not ok:
        why = "database is not answering" if database == "down" else "database is read-only (a standby)"
        body.update(error=why, code="db_unavailable")
    return json_response(body, 200 if ok else 503)
