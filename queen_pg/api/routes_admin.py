"""Queue management and health (WIRE.md §2.9, §2.12)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg import __version__
from queen_pg.api.common import check_name, json_response, parse_body, state, tenant
from queen_pg.api.docs import answers, body
from queen_pg.api.models import ConfigureBody
from queen_pg.api.schemas_admin import ConfigureAnswer, DeleteQueueAnswer, HealthAnswer
from queen_pg.engine import queues as queue_engine
from queen_pg.errors import bad_request

router = APIRouter()


@router.post(
    "/api/v1/configure",
    summary="Create or configure a queue (WIRE §2.9)",
    description="Known options are type-checked, unknown ones kept as given; encryptionEnabled=true is refused.",
    openapi_extra=body(ConfigureBody),
    responses=answers({200: ConfigureAnswer}, 400, 413),
)
async def configure(request: Request) -> Response:
    body = await parse_body(request, ConfigureBody)
    check_name("queue", body.queue)
    if body.namespace is not None:
        check_name("namespace", body.namespace)
    if body.task is not None:
        check_name("task", body.task)
    options = body.options.model_dump(exclude_none=True)
    if options.get("encryptionEnabled"):
        raise bad_request("encryptionEnabled=true is not supported by this broker yet")
    st = state(request)
    result = await queue_engine.configure(st.db, tenant(request), body.queue, body.namespace, body.task, options)
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
async def delete_queue(request: Request, queue: str) -> Response:
    check_name("queue", queue)
    st = state(request)
    deleted = await queue_engine.delete(st.db, tenant(request), queue)
    return json_response({"success": True, "queue": queue, "deleted": deleted})


@router.get(
    "/health",
    summary="Liveness: 200 when the database answers, 503 when not",
    description="The 503 body also carries `status: unhealthy`, `database: down` and `version`.",
    responses=answers({200: HealthAnswer}),
)
async def health(request: Request) -> Response:
    st = state(request)
    ok = await st.db.ping()
    body = {"status": "healthy" if ok else "unhealthy", "database": "up" if ok else "down", "version": __version__}
    if not ok:
        body.update(error="database is not answering", code="db_unavailable")
    return json_response(body, 200 if ok else 503)
