"""The read routes' one shape: ``GET``, the read-only level, documented query parameters, and a 200 JSON
answer of what the engine returned (docs/wire.md#errors for the others).

    @read_route(router, "/resources/overview", Overview, summary="Counts over every queue")
    async def overview(request: Request) -> Any:
        return await admin.overview(*db_tenant(request))

The endpoint returns the answer's data; ``read_route`` registers a route that renders it with
``json_response`` under the endpoint's own name, docstring and parameters (so its OpenAPI operation is
the one a hand-written route would have), and returns the endpoint unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from queen_pg.api.shared.common import json_response, state, tenant
from queen_pg.api.shared.docs import answers, params
from queen_pg.api.shared.params import Param
from queen_pg.db.pool import Database
from queen_pg.security.access import level
from queen_pg.security.roles import Level

Reader = Callable[..., Awaitable[Any]]


def db_tenant(request: Request) -> tuple[Database, str]:
    """What every read of the engine starts with: the database and the caller's tenant."""
    return state(request).db, tenant(request)


def read_route(
    router: APIRouter,
    path: str,
    answer: Any,
    *,
    summary: str,
    description: str | None = None,
    query: Sequence[Param] = (),
    errors: Sequence[int] = (),
) -> Callable[[Reader], Reader]:
    """Registers the decorated endpoint as ``GET path`` (read-only level) answering 200 ``answer`` or one
    of the ``errors`` statuses (503 always)."""

    def register(reader: Reader) -> Reader:
        async def endpoint(request: Request, **path_params: str) -> Response:
            return json_response(await reader(request, **path_params))

        endpoint.__name__ = endpoint.__qualname__ = reader.__name__
        endpoint.__doc__ = reader.__doc__
        signature = inspect.signature(reader, eval_str=True)
        endpoint.__dict__["__signature__"] = signature.replace(return_annotation=Response)
        router.get(
            path,
            summary=summary,
            description=description,
            openapi_extra=params(*query) if query else None,
            responses=answers({200: answer}, *errors),
        )(level(Level.READ_ONLY)(endpoint))
        return reader

    return register
