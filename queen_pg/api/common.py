"""Shared pieces of the routes: JSON responses, body parsing, name and query-param checks."""

from __future__ import annotations

import re
import time
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import orjson
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from queen_pg.api.admission import ByteBudget
from queen_pg.db.pool import Database
from queen_pg.engine.fusion import Fuser
from queen_pg.engine.maintenance import Maintenance
from queen_pg.engine.waiters import Waiters
from queen_pg.errors import BAD_JSON, NAME_TOO_LONG, STORAGE_FULL, QueenError, bad_request
from queen_pg.jobs.storage import StorageCheck
from queen_pg.limiter import Limiter
from queen_pg.mesh.node import Mesh
from queen_pg.security import principal
from queen_pg.settings import Settings

MAX_NAME_BYTES = 255
_CONTROL = re.compile(r"[\x00-\x1f]")  # checked per pushed item: a regex, not a per-character loop
M = TypeVar("M", bound=BaseModel)


@dataclass(slots=True)
class AppState:
    settings: Settings
    db: Database
    waiters: Waiters
    # overload control (queen_pg/limiter.py, queen_pg/api/admission.py, queen_pg/jobs/storage.py);
    # empty/None = not applied
    limiters: dict[str, Limiter] = field(default_factory=dict)  # route family -> its Vegas limiter
    admission: ByteBudget | None = None
    storage: StorageCheck | None = None
    fuser: Fuser | None = None  # request fusion of pushes and acks (queen_pg/engine/fusion.py); None = off
    # maintenance switches as this process last read them (queen_pg/jobs/maintenance.py)
    maintenance: Maintenance = field(default_factory=Maintenance)
    started_at: float = field(default_factory=time.time)  # wall clock when this state was built
    mesh: Mesh | None = None  # the wake mesh (queen_pg/mesh/); None = not configured


def state(request: Request) -> AppState:
    st: AppState = request.app.state.queen
    return st


def permit(request: Request, family: str) -> AbstractAsyncContextManager[None]:
    """A permit of the family's limiter, held around one engine call (429 ``overloaded`` when the
    wait runs out); no limiter for the family, no wait."""
    limiter = state(request).limiters.get(family)
    return limiter.acquire() if limiter is not None else nullcontext()


def refuse_when_storage_full(request: Request) -> None:
    """507 ``storage_full`` for a write that adds messages while the database's storage is full."""
    storage = state(request).storage
    if storage is not None and storage.full:
        raise QueenError(STORAGE_FULL, detail=f"storage is full: {storage.reason}")


def tenant(request: Request) -> str:
    """The request's tenant as the security middleware resolved it (queen_pg/security/tenancy.py)."""
    p = principal(request)
    return p.tenant if p is not None else state(request).settings.default_tenant


def producer_sub(request: Request) -> str | None:
    """The verified token's ``sub`` (JWT on), stamped on pushed messages; None without JWT."""
    p = principal(request)
    return p.sub if p is not None else None


def json_response(data: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(data), status_code=status_code, media_type="application/json", headers=headers)


def _describe(err: ValidationError) -> str:
    first = err.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
    return f"{where}: {first.get('msg', 'invalid')}"


async def parse_body(request: Request, model: type[M], *, empty_ok: bool = False) -> M:
    """Read and validate a JSON body; malformed JSON and wrong shapes are 400s."""
    raw = await request.body()
    if not raw.strip():
        if empty_ok:
            return model.model_validate({})
        raise bad_request("request body is empty; a JSON object is required")
    try:
        return model.model_validate_json(raw)
    except ValidationError as err:
        if any(e.get("type") == "json_invalid" for e in err.errors(include_url=False)):
            raise QueenError(BAD_JSON, detail=err.errors(include_url=False)[0].get("msg", "")) from None
        raise bad_request(_describe(err)) from None


def check_name(what: str, name: str) -> str:
    if not name:
        raise bad_request(f"{what} name must be a non-empty string")
    size = len(name.encode())
    if size > MAX_NAME_BYTES:
        raise QueenError(NAME_TOO_LONG, what=what, size=size, limit=MAX_NAME_BYTES)
    if _CONTROL.search(name):
        raise bad_request(f"{what} name must not contain control characters")
    return name


def q_bool(request: Request, name: str, default: bool) -> bool:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    low = raw.lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise bad_request(f"query parameter {name} must be true or false, got {raw!r}")


def q_int(request: Request, name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(f"query parameter {name} must be an integer, got {raw!r}") from None
    if not lo <= value <= hi:
        raise bad_request(f"query parameter {name} must be between {lo} and {hi}, got {value}")
    return value


def parse_timestamp(name: str, raw: str) -> datetime:
    try:
        ts = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise bad_request(f"{name} must be an ISO-8601 timestamp or 'now', got {raw!r}") from None
    if ts.tzinfo is None:
        raise bad_request(f"{name} must carry a timezone (e.g. 2026-01-01T00:00:00Z)")
    return ts
