"""The maintenance gates every pushing or popping route passes (docs/wire.md#maintenance)."""

from __future__ import annotations

from fastapi import Request

from queen_pg.api.shared.common import state
from queen_pg.errors import MAINTENANCE, QueenError


def refuse_push_in_maintenance(request: Request, pushes: bool = True) -> None:
    """503 ``maintenance`` (with ``Retry-After``) for a request that pushes while push maintenance is on."""
    if pushes and state(request).maintenance.push:
        raise QueenError(MAINTENANCE, detail="push maintenance is on: pushes are refused for now")


def pop_in_maintenance(request: Request) -> bool:
    """Whether pops must answer empty (204) at once: pop maintenance is on."""
    return state(request).maintenance.pop
