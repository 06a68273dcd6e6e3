"""The bodies of POST /api/v1/kv (docs/wire.md#kv) and POST /api/v1/locks (docs/wire.md#locks); the KV
ops are also the `kv` rider of POST /api/v1/transaction."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from queen_pg import text
from queen_pg.api.kv import ops
from queen_pg.api.shared.body import identifier

# --- request bodies, built from the rule's constants in ops.py, which decides (the Structs decode the
# --- shape and what msgspec can check of the rule; ops.py the rest: UTF-8 byte limits, the namespace
# --- rule, exactly one expiry, one write per key, key counts) -----------------------------------------

Ns = Annotated[
    str,
    identifier(
        ops.MAX_NS_BYTES,
        f"a namespace (docs/wire.md#kv-namespaces): {ops.NAMESPACE_RULE}, at most {ops.MAX_NS_BYTES} bytes (400 "
        "`bad_namespace`); `queen-locks` is written only through /api/v1/locks",
        also=ops.NAMESPACE_PATTERN,
    ),
]
Key = Annotated[str, identifier(ops.MAX_KEY_BYTES, f"1-{ops.MAX_KEY_BYTES} bytes of UTF-8, {text.RULE}")]
Version = Annotated[
    int, msgspec.Meta(ge=0, le=ops.MAX_VERSION, description="the version the key must be at; 0 = absent")
]
Ttl = Annotated[
    int, msgspec.Meta(ge=1, le=ops.MAX_TTL_SECONDS, description="exactly one of ttlSeconds or forever: true")
]
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
    keys: Annotated[list[Key], msgspec.Meta(min_length=1, max_length=ops.MAX_GET_MANY)]


class KvGetPrefix(_Op, tag="getPrefix"):
    """Not allowed in a transaction."""

    ns: Ns
    prefix: Key
    after: Key | U = UNSET
    limit: (
        Annotated[int, msgspec.Meta(description=f"rows per page; clamped to 1-{ops.MAX_PREFIX_LIMIT}, default 100")]
        | None
    ) = None
    keysOnly: bool = False


class KvPut(_Op, tag="put"):
    ns: Ns
    key: Key
    value: Value
    ttlSeconds: Ttl | U = UNSET
    forever: Literal[True] | U = UNSET
    expect: Version | U = UNSET
    required: Required = False


class KvPutIfAbsent(KvPut, tag="putIfAbsent"):  # a put whose only condition is that the key is absent
    expect: Literal[0] | U = UNSET  # narrows put's expect to 0


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

    operations: Annotated[list[KvOp], msgspec.Meta(max_length=ops.MAX_OPS)]


LockName = Annotated[
    str,
    identifier(
        ops.MAX_LOCK_NAME_BYTES,
        f"1-{ops.MAX_LOCK_NAME_BYTES} bytes of UTF-8, no '#', {text.RULE}",
        pattern=ops.LOCK_NAME_PATTERN,
    ),
]
Owner = Annotated[
    str,
    identifier(
        ops.MAX_OWNER_BYTES,
        f"1-{ops.MAX_OWNER_BYTES} bytes of UTF-8, {text.RULE}; the same owner acquiring again gets its permit back",
    ),
]
Token = Annotated[int, msgspec.Meta(ge=1, le=ops.MAX_VERSION)]
Slot = Annotated[int, msgspec.Meta(ge=0, le=ops.MAX_LOCK_LIMIT - 1)]


class LockAcquire(_Op, tag="acquire"):
    name: LockName
    ttlSeconds: Ttl
    owner: Owner | None = None
    limit: (
        Annotated[
            int,
            msgspec.Meta(
                ge=1, le=ops.MAX_LOCK_LIMIT, description=f"permits; at most {ops.MAX_LOCK_SLOTS} slots per call"
            ),
        ]
        | None
    ) = None


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
    operations: Annotated[list[LockAcquire | LockRenew | LockRelease | LockGet], msgspec.Meta(max_length=ops.MAX_OPS)]
