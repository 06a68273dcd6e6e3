"""The bodies of POST /api/v1/kv (docs/wire.md#kv) and POST /api/v1/locks (docs/wire.md#locks); the KV
ops are also the `kv` rider of POST /api/v1/transaction."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from queen_pg.api.shared.body import INT32, INT64

# --- request bodies: the Structs decode (shape, types, ranges, characters); ops.py keeps what a
# --- schema cannot say (UTF-8 byte limits, exactly one expiry, one write per key, key counts) -------

PRINTABLE = r"^[^\x00-\x1f\x7f-\x9f]+$"  # no C0/C1 control character, not empty


Ns = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=128,
        pattern=PRINTABLE,
        description="1-128 bytes of UTF-8, no control characters; `queen-locks` is written only through /api/v1/locks",
    ),
]
Key = Annotated[
    str,
    msgspec.Meta(
        min_length=1, max_length=1024, pattern=PRINTABLE, description="1-1024 bytes of UTF-8, no control characters"
    ),
]
Version = Annotated[int, msgspec.Meta(ge=0, le=INT64, description="the version the key must be at; 0 = absent")]
Ttl = Annotated[int, msgspec.Meta(ge=1, le=INT32, description="exactly one of ttlSeconds or forever: true")]
Number = Annotated[float, msgspec.Meta(description="a number (not a bool); integers within 64 bits")]
Required = Annotated[bool, msgspec.Meta(description="a lost condition refuses the whole call (200 verdict)")]
Value = Annotated[Any, msgspec.Meta(description="any JSON value (null is a value); at most 1 MiB, no U+0000")]
UNSET = msgspec.UNSET
U = msgspec.UnsetType


class _Op(msgspec.Struct, tag_field="op", forbid_unknown_fields=True):
    pass


class KvGet(_Op, tag="get"):
    ns: Ns
    key: Key


class KvGetMany(_Op, tag="getMany"):
    ns: Ns
    keys: Annotated[list[Key], msgspec.Meta(min_length=1, max_length=256)]


class KvGetPrefix(_Op, tag="getPrefix"):
    """Not allowed in a transaction."""

    ns: Ns
    prefix: Key
    after: Key | U = UNSET
    limit: Annotated[int, msgspec.Meta(description="rows per page; clamped to 1-1000, default 100")] | None = None
    keysOnly: bool = False


class KvPut(_Op, tag="put"):
    ns: Ns
    key: Key
    value: Value
    ttlSeconds: Ttl | U = UNSET
    forever: Literal[True] | U = UNSET
    expect: Version | U = UNSET
    required: Required = False


class KvPutIfAbsent(_Op, tag="putIfAbsent"):
    ns: Ns
    key: Key
    value: Value
    ttlSeconds: Ttl | U = UNSET
    forever: Literal[True] | U = UNSET
    expect: Literal[0] | U = UNSET
    required: Required = False


class KvDelete(_Op, tag="delete"):
    ns: Ns
    key: Key
    expect: Version | U = UNSET
    required: Required = False


class KvIncr(_Op, tag="incr"):
    """The TTL applies when the counter is created; an expired or missing counter counts as 0."""

    ns: Ns
    key: Key
    delta: Number = 1
    min: Number | None = None
    max: Number | None = None
    ttlSeconds: Ttl | U = UNSET
    forever: Literal[True] | U = UNSET
    required: Required = False


class KvCheck(_Op, tag="check"):
    """A condition only (a lock's `guard` is one)."""

    ns: Ns
    key: Key
    expect: Version
    required: Required = False


KvOp = KvGet | KvGetMany | KvGetPrefix | KvPut | KvPutIfAbsent | KvDelete | KvIncr | KvCheck
TxKvOp = KvGet | KvGetMany | KvPut | KvPutIfAbsent | KvDelete | KvIncr | KvCheck


class KvRequest(msgspec.Struct):
    """At most 64 ops and 256 distinct (ns, key) pairs per call, one write per key."""

    operations: Annotated[list[KvOp], msgspec.Meta(max_length=64)]


LockName = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=256,
        pattern=r"^[^\x00-\x1f\x7f-\x9f#]+$",
        description="1-256 bytes of UTF-8, no '#', no control characters",
    ),
]
Owner = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=256,
        pattern=PRINTABLE,
        description="at most 256 bytes of UTF-8; the same owner acquiring again gets its permit back",
    ),
]
Token = Annotated[int, msgspec.Meta(ge=1, le=INT64)]
Slot = Annotated[int, msgspec.Meta(ge=0, le=1023)]


class LockAcquire(_Op, tag="acquire"):
    name: LockName
    ttlSeconds: Ttl
    owner: Owner | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=1024, description="permits; at most 1024 slots per call")] | None = None


class LockRenew(_Op, tag="renew"):
    name: LockName
    token: Token
    ttlSeconds: Ttl
    slot: Slot | None = None
    owner: Owner | None = None


class LockRelease(_Op, tag="release"):
    name: LockName
    token: Token
    slot: Slot | None = None


class LockGet(_Op, tag="get"):
    name: LockName


class LocksRequest(msgspec.Struct):
    operations: Annotated[list[LockAcquire | LockRenew | LockRelease | LockGet], msgspec.Meta(max_length=64)]
