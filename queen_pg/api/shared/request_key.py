"""The request key of the outcome window: ``Idempotency-Key``, else ``X-Request-Id``.

A request that carries one is applied at most once within ``QUEEN_REQUEST_ID_WINDOW_S``: a retry with
the same key, route and body gets the recorded answer (with ``Idempotent-Replayed: true``), the same
key with another body is 422 ``idempotency_key_reused`` (queen_pg/engine/outcomes.py,
sql/procedures/096_outcomes.sql). Such a request is never fused with others.
"""

from __future__ import annotations

from fastapi import Request

from queen_pg.api.shared.common import state
from queen_pg.engine.outcomes import MAX_KEY_BYTES, Once, once
from queen_pg.errors import bad_request

HEADERS = ("idempotency-key", "x-request-id")
REPLAYED_HEADER = "Idempotent-Replayed"


def header_key(request: Request) -> str | None:
    """The request's key (an empty header counts as none); 400 when it is too long."""
    for name in HEADERS:
        value = request.headers.get(name, "").strip()
        if value:
            if len(value.encode()) > MAX_KEY_BYTES:
                raise bad_request(f"{name} must be at most {MAX_KEY_BYTES} bytes, got {len(value.encode())}")
            return value
    return None


async def request_once(request: Request, route: str) -> Once | None:
    """The outcome-window record of this request, or None without a key."""
    key = header_key(request)
    if key is None:
        return None
    return once(key, route, await request.body(), state(request).settings.request_id_window_s)


def replay_headers(o: Once | None) -> dict[str, str] | None:
    return {REPLAYED_HEADER: "true"} if o is not None and o.replayed else None
