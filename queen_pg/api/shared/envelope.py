"""The error envelope of the KV, locks and timers families (docs/wire.md#errors), and their ops read
as exact JSON for the semantic checks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from fastapi.responses import Response

from queen_pg.api.shared import raw_fields
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


def exact_ops(raw: bytes, decoded: Sequence[Any] = ()) -> list[Any]:
    """The body's operations as plain JSON (integers exact) for the semantic checks of each family's ops
    module. ``decoded``: the same ops as the body's Struct read them; for a big body
    (api/shared/raw_fields.py) their free-form fields are taken from there (``Prepared``), not built."""
    if len(raw) < raw_fields.BIG_BODY or not decoded:
        ops: list[Any] = msgspec.json.decode(raw)["operations"]
        return ops
    return plain_ops(_raw_ops.decode(raw).operations, decoded)


class RawOps(msgspec.Struct):
    operations: list[dict[str, msgspec.Raw]]


_raw_ops = msgspec.json.Decoder(RawOps)


def plain_ops(ops: list[dict[str, msgspec.Raw]], decoded: Sequence[Any]) -> list[Any]:
    """Ops read field by field (``ops``: as ``msgspec.Raw``): a field the Struct of the same op holds as
    ``Prepared`` is that, any other is decoded (a name, a key, a number: small)."""
    out: list[Any] = []
    for op, struct in zip(ops, decoded, strict=True):
        plain: dict[str, Any] = {}
        for name, value in op.items():
            known = getattr(struct, name, None)
            plain[name] = known if isinstance(known, raw_fields.Prepared) else msgspec.json.decode(value)
        out.append(plain)
    return out
