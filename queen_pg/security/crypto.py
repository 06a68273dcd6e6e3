"""Encrypted queues: payloads at rest under AES-256-GCM. Cryptography only: seal, open, keys.

A sealed payload is ``0x00 | u8 version (2) | u8[4] key id | u8[12] nonce | ciphertext + 16-byte tag``.
The leading NUL byte never starts a JSON text, so a sealed payload names itself wherever it is stored
as bytes (a frame payload, ``timers.payload``, ``log_dlq.sealed``); in a QPF1 frame flag 4 says it too
(docs/wire.md#frame-flags). The key id is the first 4 bytes of SHA-256 over the key, so
``QUEEN_ENCRYPTION_KEYS_OLD`` decrypts what older keys sealed and the key itself is never stored. A
fresh random 96-bit nonce per payload.

The GCM associated data is the first six bytes followed by the payload's :class:`Place`: its tenant,
queue and partition names (each a u32 length and UTF-8). So ciphertext copied into another tenant's,
queue's or partition's rows (SQL access, a restored dump) does not open there: 409
``encryption_key_unknown``, logged, never the plaintext. No legitimate path moves a payload out of its
partition (a dead letter, its requeue, a message's detail, a timer and the message it fires all stay
in the (tenant, queue, partition) the payload was sealed for), so nothing is sealed again. The names
are what the caller already holds (the push item, the pop row), never a database round trip.
Version 1 (the first release) bound only the six head bytes; it is still opened, and written only
with ``QUEEN_ENCRYPTION_SEAL_VERSION=1`` (a rolling upgrade: brokers of the earlier release refuse
version 2).

Whether a queue is encrypted is decided by the database (``queues.encryption_enabled``):
``queen.push_v1`` refuses, under the partition lock, a group whose sealing disagrees with its queue
(``encryption_mismatch``, nothing written). :class:`Vault` keeps a cache of that answer per
(tenant, queue) so the next push seals at once; the engine retries a refused push after learning the
answer (``queen_pg/engine/sealing.py``), so a stale cache costs one refused call, never plaintext in
an encrypted queue.

The vault belongs to a :class:`~queen_pg.db.pool.Database` handle (:func:`bind`, :func:`vault`), so
every engine function that is given the handle finds it without a new parameter.

The embedded default (``queen-pg serve`` with no database URL) needs no key to be configured:
:func:`embedded_keys` generates one once into ``<data_dir>/encryption_key`` (0600), beside the database
it protects. A configured ``QUEEN_ENCRYPTION_KEY`` wins and the file is then never created; a file
left by earlier runs stays readable as an old key.

This module imports only ``queen_pg.errors``, ``queen_pg.setting_values`` and ``queen_pg.owned_files``
(the key file: never through a link) of queen_pg: the engine
calls it, never the other way round (docs/architecture.md#imports).
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import struct
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from queen_pg.errors import ENCRYPTION_KEY_MISSING, ENCRYPTION_KEY_UNKNOWN, QueenError
from queen_pg.owned_files import open_owned, read_owned
from queen_pg.setting_values import parse_key, parse_keys

MARK = 0x00
VERSION = 2  # what :meth:`Vault.seal` writes: the associated data binds the payload's place
VERSION_UNBOUND = 1  # the first release's: the associated data is the head alone; still opened
_HEAD = struct.Struct("<BB4s")
_LEN = struct.Struct("<I")
HEAD_LEN = _HEAD.size  # 6: mark, version, key id
NONCE_LEN = 12
TAG_LEN = 16
CACHE_MAX = 100_000  # (tenant, queue) answers kept; beyond it the cache starts over (it is only a hint)
KEY_FILE = "encryption_key"  # the embedded default's generated key, in the data dir
NO_KEY = (
    "this broker has no QUEEN_ENCRYPTION_KEY: set it (64 hex characters, e.g. `openssl rand -hex 32`, the same "
    "on every broker of the database); only the embedded default (`queen-pg serve` without DATABASE_URL) "
    "generates one in its data directory"
)


log = logging.getLogger("queen_pg.crypto")


class Place:
    """Where a sealed payload belongs: (tenant, queue, partition), and the associated data's tail that
    names them (made once per place: a push seals a group's payloads, a pop opens a row's, with one)."""

    __slots__ = ("aad", "partition", "queue", "tenant")

    def __init__(self, tenant: str, queue: str, partition: str) -> None:
        self.tenant, self.queue, self.partition = tenant, queue, partition
        parts = [n.encode("utf-8", "surrogatepass") for n in (tenant, queue, partition)]
        self.aad = b"".join([_LEN.pack(len(b)) + b for b in parts])

    def __repr__(self) -> str:
        return f"Place({self.tenant!r}, {self.queue!r}, {self.partition!r})"

    def __str__(self) -> str:
        return f"queue {self.queue!r} partition {self.partition!r}"


def key_id(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()[:4]


def is_sealed(payload: bytes) -> bool:
    return len(payload) > HEAD_LEN and payload[0] == MARK


class Vault:
    """The keys of this process and its cache of which queues are encrypted."""

    def __init__(self, key: bytes | None = None, old: Sequence[bytes] = (), seal_version: int = VERSION) -> None:
        if seal_version not in (VERSION, VERSION_UNBOUND):
            raise ValueError(f"unknown sealed format version {seal_version}")
        self._current = (key_id(key), AESGCM(key)) if key is not None else None
        self._bound = seal_version == VERSION  # False: write version 1 (QUEEN_ENCRYPTION_SEAL_VERSION=1)
        self._keys: dict[bytes, AESGCM] = {}
        for k in (*old, *([key] if key is not None else [])):
            self._keys[key_id(k)] = AESGCM(k)
        self._encrypted: dict[tuple[str, str], bool] = {}

    def __repr__(self) -> str:  # never the keys
        return f"Vault(key={'set' if self._current else 'none'}, readable={len(self._keys)})"

    @classmethod
    def from_settings(cls, key: str, old: str, seal_version: int = VERSION) -> Vault:
        current, olds = parse_keys(key, old)
        return cls(current, olds, seal_version)

    @property
    def can_seal(self) -> bool:
        return self._current is not None

    @property
    def can_open(self) -> bool:
        """Any key (current or old): only then can a stored segment hold frames this broker may open."""
        return bool(self._keys)

    def seal(self, plaintext: bytes, place: Place) -> bytes:
        """``plaintext`` sealed for ``place`` (version 2): it opens there and nowhere else. With
        ``seal_version`` 1 (a rolling upgrade from a release that reads only version 1), unbound."""
        if self._current is None:
            raise QueenError(ENCRYPTION_KEY_MISSING, detail=NO_KEY)
        kid, aes = self._current
        nonce = os.urandom(NONCE_LEN)
        if not self._bound:  # a rolling upgrade's old brokers read only version 1
            head = _HEAD.pack(MARK, VERSION_UNBOUND, kid)
            return head + nonce + aes.encrypt(nonce, plaintext, head)
        head = _HEAD.pack(MARK, VERSION, kid)
        return head + nonce + aes.encrypt(nonce, plaintext, head + place.aad)

    def open(self, sealed: bytes, place: Place) -> bytes:
        """The plaintext of a payload read in ``place``; 409 ``encryption_key_unknown`` (logged) when
        no key of this process sealed it, or it does not authenticate there: sealed for another
        tenant, queue or partition, or altered (never a 500, never the bytes). A version-1 payload
        (no place in its associated data) opens as it always did."""
        if len(sealed) < HEAD_LEN + NONCE_LEN + TAG_LEN:
            raise _refused(place, "a sealed payload is truncated")
        mark, version, kid = _HEAD.unpack_from(sealed)
        if mark != MARK or version not in (VERSION, VERSION_UNBOUND):
            raise _refused(place, f"a payload is sealed in format version {version}, which this broker does not know")
        aes = self._keys.get(kid)
        if aes is None:
            raise _refused(
                place,
                f"a payload is sealed with key id {kid.hex()}, which is neither QUEEN_ENCRYPTION_KEY nor "
                "in QUEEN_ENCRYPTION_KEYS_OLD",
            )
        head = sealed[:HEAD_LEN]
        nonce = sealed[HEAD_LEN : HEAD_LEN + NONCE_LEN]
        try:
            return aes.decrypt(nonce, sealed[HEAD_LEN + NONCE_LEN :], head + place.aad if version == VERSION else head)
        except InvalidTag:
            why = "was altered"
            if version == VERSION:
                why = "was sealed for another tenant, queue or partition, or altered"
            raise _refused(
                place, f"a payload sealed with key id {kid.hex()} does not authenticate in {place}: it {why}"
            ) from None

    def clear(self, payload: bytes, place: Place) -> bytes:
        """``payload`` (read in ``place``) as JSON text: opened when sealed, as it is otherwise."""
        return self.open(payload, place) if is_sealed(payload) else payload

    # --- which queues are encrypted: a hint, the database decides ---------------------------------

    def encrypted(self, tenant: str, queue: str) -> bool:
        return self._encrypted.get((tenant, queue), False)

    def learn(self, tenant: str, queue: str, encrypted: bool) -> None:
        if len(self._encrypted) >= CACHE_MAX:
            self._encrypted.clear()
        self._encrypted[(tenant, queue)] = encrypted

    def forget(self, tenant: str, queue: str) -> None:
        """A peer changed the queue's config (mesh CONFIG frame): ask the database again."""
        self._encrypted.pop((tenant, queue), None)

    def seal_for(self, place: Place, payload: bytes) -> tuple[bytes, bool]:
        """The payload as it is to be stored in ``place`` by the cache's belief, and whether sealed."""
        if self.encrypted(place.tenant, place.queue):
            return self.seal(payload, place), True
        return payload, False


def _refused(place: Place, detail: str) -> QueenError:
    """A payload this broker will not open, logged (a key missing here, or ciphertext moved or altered
    with SQL access); the answer names the queue and partition the caller asked for, never a payload."""
    log.warning("encrypted payload not opened (tenant %r, %s): %s", place.tenant, place, detail)
    return QueenError(ENCRYPTION_KEY_UNKNOWN, detail=detail)


_VAULTS: weakref.WeakKeyDictionary[Any, Vault] = weakref.WeakKeyDictionary()
_NO_KEYS = Vault()


def bind(db: object, v: Vault) -> None:
    """Give the database handle its vault (the app's lifespan does, from the settings)."""
    _VAULTS[db] = v


def vault(db: object) -> Vault:
    """The vault of a database handle; one without keys when none was bound (every queue plain)."""
    return _VAULTS.get(db, _NO_KEYS)


class _Framed(Protocol):
    @property
    def payload(self) -> bytes: ...
    @property
    def sealed(self) -> bool: ...


def opened(v: Vault | None, frame: _Framed, place: Place) -> bytes:
    """A frame's payload, read in ``place``, as JSON text: opened with ``v`` when the frame is sealed (flag 4)."""
    if not frame.sealed:
        return frame.payload
    return (v or _NO_KEYS).open(frame.payload, place)


def embedded_keys(key: str, old: str, data_dir: Path) -> tuple[str, str]:
    """(QUEEN_ENCRYPTION_KEY, QUEEN_ENCRYPTION_KEYS_OLD) for a broker on the embedded database in
    ``data_dir``. No key configured: the data dir's key, generated on first use (64 hex, 0600). A
    configured key wins and no file is created; a file an earlier run generated, when it differs,
    joins the old keys (what it sealed stays readable). ValueError names a malformed file, or one
    this account does not own (the data dir belongs to the ``postgres`` account on a root install:
    a key it planted would be one it knows)."""
    path = data_dir / KEY_FILE
    if key.strip():
        kept = _read_key_file(path)
        if kept is None:
            return key, old
        olds = [k.strip() for k in old.split(",") if k.strip()]
        if kept.lower() == key.strip().lower() or kept.lower() in (k.lower() for k in olds):
            return key, old
        return key, ",".join([*olds, kept])
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = open_owned(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        kept = _read_key_file(path)
        if kept is None:  # gone in between: the next start makes one
            raise ValueError(f"{path} vanished while it was read") from None
        return kept, old
    generated = secrets.token_hex(32)
    with os.fdopen(fd, "w") as f:
        f.write(generated + "\n")
        f.flush()
        os.fsync(f.fileno())
    return generated, old


def _read_key_file(path: Path) -> str | None:
    """The key in ``path`` (None: no file); ValueError unless it is a regular file of this account
    (one link, never read through a symbolic link) holding 64 hex characters. Its mode is set back to 0600."""
    text = read_owned(path, chmod=0o600)
    if text is None:
        return None
    kept = text.strip()
    parse_key(kept, str(path))
    return kept
