"""KV browsing for the dashboard's KV page; both routes read only (no client counterpart in WIRE.md).

* ``GET /api/v1/kv/namespaces[?after=&limit=]``: the tenant's namespaces, a keyset page.
* ``GET /api/v1/kv/keys?ns=[&prefix=&after=&limit=&keysOnly=]``: a namespace's live keys, the
  ``getPrefix`` op of ``POST /api/v1/kv`` with an empty prefix allowed (the op wants a non-empty one).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import Field

from queen_pg.api.common import check_name, json_response, permit, q_bool, q_int, state, tenant
from queen_pg.api.docs import answers, params, query
from queen_pg.api.schemas import Answer
from queen_pg.engine import kv as kv_engine
from queen_pg.errors import bad_request

router = APIRouter()


class KvNamespaces(Answer):
    namespaces: list[str] = Field(description="ascending; a namespace whose keys all expired may linger until swept")
    truncated: bool
    nextAfter: str | None = Field(description="pass as `after` for the next page; null on the last one")


@router.get(
    "/api/v1/kv/namespaces",
    summary="KV namespaces, ascending, a keyset page (after, limit)",
    openapi_extra=params(
        query("after", "the page after this namespace (exclusive)"),
        query("limit", "rows per page, 1-1000", type="integer", default=100),
    ),
    responses=answers({200: KvNamespaces}, 400, 429),
)
async def namespaces(request: Request) -> Response:
    after = request.query_params.get("after") or None
    limit = q_int(request, "limit", 100, 1, 1000) or 100
    async with permit(request, "kv"):
        page = await kv_engine.namespaces(state(request).db, tenant(request), after, limit)
    return json_response(page)


class KvKeyRow(Answer):
    key: str
    value: object = Field(default=None, description="absent with keysOnly=true")
    version: int
    expiresAt: str | None
    updatedAt: str


class KvKeys(Answer):
    prefix: str
    rows: list[KvKeyRow]
    truncated: bool
    nextAfter: str | None = Field(description="pass as `after` for the next page; null on the last one")


@router.get(
    "/api/v1/kv/keys",
    summary="A namespace's live keys by prefix (empty = all), byte order, a keyset page",
    openapi_extra=params(
        query("ns", "the namespace", required=True),
        query("prefix", "keys starting with this (default: every key)"),
        query("after", "the page after this key (exclusive)"),
        query("limit", "rows per page, 1-1000", type="integer", default=100),
        query("keysOnly", "leave the values out", type="boolean", default=False),
    ),
    responses=answers({200: KvKeys}, 400, 429),
)
async def keys(request: Request) -> Response:
    ns = request.query_params.get("ns")
    if ns is None:
        raise bad_request("query parameter ns is required")
    check_name("namespace", ns)
    prefix = request.query_params.get("prefix") or ""
    after = request.query_params.get("after") or None
    limit = q_int(request, "limit", 100, 1, 1000) or 100
    keys_only = q_bool(request, "keysOnly", False)
    async with permit(request, "kv"):
        page = await kv_engine.keys(state(request).db, tenant(request), ns, prefix, after, limit, keys_only)
    return json_response(page)
