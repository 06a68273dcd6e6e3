"""KV browsing for the dashboard's KV page; both routes read only (no client counterpart in docs/wire.md).

* ``GET /api/v1/kv/namespaces[?after=&limit=]``: the tenant's namespaces, a keyset page.
* ``GET /api/v1/kv/keys?ns=[&prefix=&after=&limit=&keysOnly=]``: a namespace's live keys, the
  ``getPrefix`` op of ``POST /api/v1/kv`` with an empty prefix allowed (the op wants a non-empty one).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field

from queen_pg.api.shared import params as P
from queen_pg.api.shared.common import answer_budget, permit
from queen_pg.api.shared.reads import db_tenant, read_route
from queen_pg.api.shared.schemas import Answer
from queen_pg.engine import kv as kv_engine

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


@read_route(
    router,
    "/api/v1/kv/namespaces",
    KvNamespaces,
    summary="KV namespaces, ascending, a keyset page (after, limit)",
    query=(AFTER_NS, LIMIT),
    errors=(400, 429),
)
async def namespaces(request: Request) -> Any:
    after, limit = AFTER_NS.read(request), LIMIT.read(request)
    async with permit(request, "kv"):
        return await kv_engine.namespaces(*db_tenant(request), after, limit)


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


@read_route(
    router,
    "/api/v1/kv/keys",
    KvKeys,
    summary="A namespace's live keys by prefix (empty = all), byte order, a keyset page",
    description="The page stops early (`truncated`, `nextAfter`) when its rows reach the answer budget "
    "(QUEEN_MAX_ANSWER_BYTES); it always holds at least one row.",
    query=(NS, PREFIX, AFTER_KEY, LIMIT, KEYS_ONLY),
    errors=(400, 429),
)
async def keys(request: Request) -> Any:
    ns, prefix, after = NS.read(request), PREFIX.read(request), AFTER_KEY.read(request)
    limit, keys_only = LIMIT.read(request), KEYS_ONLY.read(request)
    async with permit(request, "kv"):
        return await kv_engine.keys(
            *db_tenant(request), ns, prefix, after, limit, keys_only, max_bytes=answer_budget(request)
        )
