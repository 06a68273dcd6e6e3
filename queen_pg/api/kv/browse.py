"""KV browsing for the dashboard's KV page; both routes read only (no client counterpart in docs/wire.md).

* ``GET /api/v1/kv/namespaces[?after=&limit=]``: the tenant's namespaces, a keyset page.
* ``GET /api/v1/kv/keys?ns=[&prefix=&after=&limit=&keysOnly=]``: a namespace's live keys, the
  ``getPrefix`` op of ``POST /api/v1/kv`` with an empty prefix allowed (the op wants a non-empty one).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import Field

from queen_pg.api.shared import params as P
from queen_pg.api.shared.common import answer_budget, json_response, permit, state, tenant
from queen_pg.api.shared.docs import answers, params
from queen_pg.api.shared.schemas import Answer
from queen_pg.engine import kv as kv_engine
from queen_pg.security.access import level
from queen_pg.security.roles import Level

router = APIRouter()

AFTER_NS = P.Param("after", "the page after this namespace (exclusive)", "text")
LIMIT = P.Param("limit", "rows per page", "int", 100, 1, 1000)
NS = P.Param("ns", "the namespace", "name", required=True)
PREFIX = P.Param("prefix", "keys starting with this (default: every key)", "text", "")
AFTER_KEY = P.Param("after", "the page after this key (exclusive)", "text")
KEYS_ONLY = P.Param("keysOnly", "leave the values out", "bool", False)


class KvNamespaces(Answer):
    namespaces: list[str] = Field(description="ascending; a namespace whose keys all expired may linger until swept")
    truncated: bool
    nextAfter: str | None = Field(description="pass as `after` for the next page; null on the last one")


@router.get(
    "/api/v1/kv/namespaces",
    summary="KV namespaces, ascending, a keyset page (after, limit)",
    openapi_extra=params(AFTER_NS.doc(), LIMIT.doc()),
    responses=answers({200: KvNamespaces}, 400, 429),
)
@level(Level.READ_ONLY)
async def namespaces(request: Request) -> Response:
    after = AFTER_NS.read(request)
    limit = LIMIT.read(request)
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
    description="The page stops early (`truncated`, `nextAfter`) when its rows reach the answer budget "
    "(QUEEN_MAX_ANSWER_BYTES); it always holds at least one row.",
    openapi_extra=params(NS.doc(), PREFIX.doc(), AFTER_KEY.doc(), LIMIT.doc(), KEYS_ONLY.doc()),
    responses=answers({200: KvKeys}, 400, 429),
)
@level(Level.READ_ONLY)
async def keys(request: Request) -> Response:
    ns = NS.read(request)
    prefix = PREFIX.read(request)
    after = AFTER_KEY.read(request)
    limit = LIMIT.read(request)
    keys_only = KEYS_ONLY.read(request)
    async with permit(request, "kv"):
        page = await kv_engine.keys(
            state(request).db, tenant(request), ns, prefix, after, limit, keys_only, max_bytes=answer_budget(request)
        )
    return json_response(page)
