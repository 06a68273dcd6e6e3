"""The outcome window: a request under a key (``Idempotency-Key`` / ``X-Request-Id``) is applied once.

A keyed request calls the ``_v2`` procedure of its family (``sql/procedures/096_outcomes.sql``), which
serializes on the key, replays a live record of the same route and body, or applies the ``_v1`` effect
and records its raw result in the same transaction. The engine renders a replayed result exactly as
it rendered the first one, so the answer is the same. A request without a key calls ``_v1``, as before.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import xxhash

MAX_KEY_BYTES = 255


@dataclass(slots=True)
class Once:
    """A request under the outcome window. ``replayed`` is set by the engine call: True when the
    answer is the recorded one and nothing was applied."""

    key: str
    route: str  # the route's name: push, ack, ack/batch, transaction, kv, locks
    body_hash: uuid.UUID
    window_s: int
    replayed: bool = False

    def args(self) -> tuple[Any, ...]:
        """The trailing arguments of every ``_v2`` procedure: key, route, body hash, window."""
        return (self.key, self.route, self.body_hash, self.window_s)


def body_hash(body: bytes) -> uuid.UUID:
    """xxh3-128 of the request body, as stored in ``request_outcomes.body_hash``."""
    return uuid.UUID(bytes=xxhash.xxh3_128_digest(body))


def once(key: str | None, route: str, body: bytes, window_s: int) -> Once | None:
    """The request's :class:`Once`, or None without a key (an empty key counts as none)."""
    if not key:
        return None
    return Once(key, route, body_hash(body), window_s)
