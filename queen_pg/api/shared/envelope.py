"""The error envelope of the KV, locks and timers families (docs/wire.md#errors), and their ops read
as exact JSON for the semantic checks."""

from __future__ import annotations

from typing import Any

import msgspec
from fastapi.responses import Response

from queen_pg.api.shared.common import json_response
from queen_pg.errors import QueenError


def family_envelope(exc: QueenError) -> Response:
    """The KV/locks error envelope; 503s and 429s keep ``Retry-After`` like every other route."""
    body = {
        "error": exc.code,
        "code": exc.code,
        "reason": str(exc.fields.get("reason") or exc.code),
        "detail": str(exc),
    }
    return json_response(body, exc.status, exc.headers())


def exact_ops(raw: bytes) -> list[Any]:
    """The body's operations as plain JSON (integers exact) for the semantic checks of each family's ops module."""
    ops: list[Any] = msgspec.json.decode(raw)["operations"]
    return ops
