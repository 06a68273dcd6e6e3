"""The engine's side of encrypted queues: when to seal, the retry after the database disagrees, and
the re-encoding of a segment whose payloads a framed pop must ship opened.

``queen_pg/security/crypto.py`` only seals, opens and holds keys; the decisions that involve a
procedure call, a stored segment or a queue's configuration are here, and call it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import orjson

from queen_pg.engine import codec
from queen_pg.errors import ENCRYPTION_KEY_MISSING, ENCRYPTION_MISMATCH, QueenError
from queen_pg.security.crypto import NO_KEY, Place, Vault, opened, vault

PUSH_ATTEMPTS = 4  # a push whose queues flip between attempts more often than this gives up (503)

T = TypeVar("T")


def mismatched(err: QueenError) -> dict[str, bool] | None:
    """The queues (name -> encrypted) a refused push named, or None when ``err`` is another error."""
    if err.kind is not ENCRYPTION_MISMATCH:
        return None
    try:
        named = orjson.loads(str(err.fields.get("detail", "{}")))
    except orjson.JSONDecodeError:
        return {}
    return {str(k): bool(v) for k, v in named.items()} if isinstance(named, dict) else {}


async def push_sealed(v: Vault, tenant: str, queues: Iterable[str], attempt: Callable[[], Awaitable[T]]) -> T:
    """Run ``attempt`` (which seals by ``v``'s cache) until the database agrees with the sealing.
    On ``encryption_mismatch`` the named queues' answers are learned and the attempt is made again;
    an encrypted queue with no key here is 409 ``encryption_key_missing`` before any write."""
    names = set(queues)
    for _ in range(PUSH_ATTEMPTS):
        if not v.can_seal:
            missing = sorted(q for q in names if v.encrypted(tenant, q))
            if missing:
                raise QueenError(
                    ENCRYPTION_KEY_MISSING,
                    detail=f"queue {missing[0]!r} is encrypted and {NO_KEY}",
                )
        try:
            return await attempt()
        except QueenError as err:
            named = mismatched(err)
            if named is None:
                raise
            for q, enc in named.items():
                v.learn(tenant, q, enc)
    raise QueenError(ENCRYPTION_MISMATCH, detail="the queues' encryption kept changing; retry the request")


def may_configure(db: object, options: dict[str, Any]) -> None:
    """``encryptionEnabled: true`` on a broker without QUEEN_ENCRYPTION_KEY: 409 before any write."""
    if options.get("encryptionEnabled") is True and not vault(db).can_seal:
        raise QueenError(
            ENCRYPTION_KEY_MISSING,
            detail=f"encryptionEnabled needs an encryption key: {NO_KEY}",
        )


def forgetting(v: Vault, on_config: Callable[[str, str], None]) -> Callable[[str, str], None]:
    """A mesh CONFIG handler that also drops the vault's answer for that queue (a peer configured it)."""

    def handler(tenant: str, queue: str) -> None:
        v.forget(tenant, queue)
        on_config(tenant, queue)

    return handler


def opened_blob(v: Vault, blob: bytes, codec_id: int, place: Place) -> tuple[bytes, int]:
    """A stored segment blob of ``place`` as a framed pop may ship it (docs/wire.md: clients refuse
    flag 4): as it is when no frame is sealed, else its frames re-encoded raw (codec 0) with opened payloads."""
    frames = list(codec.unpack(blob, codec_id))
    if not any(f.sealed for f in frames):
        return blob, codec_id
    raw = b"".join(
        codec.encode_frame(f.message_id, f.transaction_id, opened(v, f, place), f.trace_id, f.producer_sub)
        for f in frames
    )
    return raw, codec.CODEC_RAW


def opened_row(v: Vault, tenant: str, row: Any) -> Any:
    """A pop_v1 row whose segment a framed pop may ship: its blob through :func:`opened_blob`, opened
    for ``tenant`` and the row's queue and partition."""
    place = Place(tenant, row["queue_name"], row["partition_name"])
    blob, codec_id = opened_blob(v, row["payload"], row["codec"], place)
    if blob is row["payload"]:
        return row
    return {**dict(row), "payload": blob, "codec": codec_id}


def opened_rows(v: Vault, tenant: str, rows: Sequence[Any]) -> tuple[Sequence[Any], bool]:
    """The rows of a framed pop of ``tenant`` (each with the segment's ``sealed`` column) as the broker
    may ship them, and whether any was opened. Only a segment that may hold a sealed frame (``sealed`` true, or
    NULL: written before revision 0012, or not visible to the statement's snapshot) is decoded; the
    others ship as stored (decoding every segment to look cost -30 % framed pop + ack)."""
    if not v.can_open:  # without keys nothing is sealed by this broker: as stored
        return rows, False
    shown = [opened_row(v, tenant, r) if r["sealed"] is not False else r for r in rows]
    return shown, any(a is not b for a, b in zip(shown, rows, strict=True))
