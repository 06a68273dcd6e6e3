"""Driver types the engine may use without importing asyncpg itself.

``fast_uuid(raw)`` builds asyncpg's C implementation of ``uuid.UUID`` (a subclass: same equality,
hashing, ``str`` and ``.bytes``): ~0.1 µs from 16 bytes against ~1 µs for ``uuid.UUID``, and its
``str`` ~0.07 µs against ~1.7 µs, which matters per message on push and pop.
"""

from __future__ import annotations

import uuid

from asyncpg.pgproto.pgproto import UUID as _PgUUID


def fast_uuid(raw: bytes) -> uuid.UUID:
    value: uuid.UUID = _PgUUID(raw)
    return value
