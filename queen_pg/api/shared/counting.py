"""Business counters the data routes bump after answering (messages pushed, popped, acked per tenant).
The /metrics routes that expose them are in queen_pg/api/status/metrics.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import Request

from queen_pg.api.shared.common import tenant
from queen_pg.engine.ack import AckLike
from queen_pg.engine.pop_render import RenderedPop
from queen_pg.engine.push import Answer
from queen_pg.metrics import Metrics


def _metrics(request: Request) -> Metrics | None:
    m: Metrics | None = getattr(request.app.state, "metrics", None)
    return m


def count_push(request: Request, ten: str, answer: Answer) -> None:
    """After a push: messages appended (and duplicates) per tenant."""
    m = _metrics(request)
    if m is not None:
        m.count_push(ten, answer.queued, answer.duplicates)


def count_pop(request: Request, answer: RenderedPop | None) -> None:
    """After a pop: messages delivered per tenant."""
    m = _metrics(request)
    if m is not None and answer is not None:
        m.count_pop_claims(tenant(request), answer.claimed)


def count_ack(request: Request, items: Sequence[AckLike], results: Sequence[dict[str, Any]]) -> None:
    """After an ack: messages settled per tenant and status."""
    m = _metrics(request)
    if m is not None:
        m.count_ack(tenant(request), items, results)
