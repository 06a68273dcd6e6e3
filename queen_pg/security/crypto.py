"""Encrypted queues: payloads at rest under AES-256-GCM. Cryptography only: seal, open, keys.

A sealed payload is ``0x00 | u8 version (1) | u8[4] key id | u8[12] nonce | ciphertext + 16-byte tag``.
The leading NUL byte never starts a JSON text, so a sealed payload names itself wherever it is stored
as bytes (a frame payload, ``timers.payload``, ``log_dlq.sealed``); in a QPF1 frame flag 4 says it too
(docs/wire.md#frame-flags). The first six bytes are the GCM associated data. The key id is the first 4 bytes of
SHA-256 over the key, so ``QUEEN_ENCRYPTION_KEYS_OLD`` decrypts what older keys sealed and the key
itself is never stored. A fresh random 96-bit nonce per payload.

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
VERSION = 1
_HEAD = struct.Struct("<BB4s")
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


def key_id(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()[:4]


def is_sealed(payload: bytes) -> bool:
    return len(payload) > HEAD_LEN and payload[0] == MARK


class Vault:
    """The keys of this process and its cache of which queues are encrypted."""

    def __init__(self, key: bytes | None = None, old: Sequence[bytes] = ()) -> None:
        self._current = (key_id(key), AESGCM(key)) if key is not None else None
        self._keys: dict[bytes, AESGCM] = {}
        for k in (*old, *([key] if key is not None else [])):
            self._keys[key_id(k)] = AESGCM(k)
        self._encrypted: dict[tuple[str, str], bool] = {}

    def __repr__(self) -> str:  # never the keys
        return f"Vault(key={'set' if self._current else 'none'}, readable={len(self._keys)})"

    @classmethod
    def from_settings(cls, key: str, old: str) -> Vault:
        current, olds = parse_keys(key, old)
        return cls(current, olds)

    @property
    def can_seal(self) -> bool:
        return self._current is not None

    @property
    def can_open(self) -> bool:
        """Any key (current or old): only then can a stored segment hold frames this broker may open."""
        return bool(self._keys)

    def seal(self, plaintext: bytes) -> bytes:
        if self._current is None:
            raise QueenError(ENCRYPTION_KEY_MISSING, detail=NO_KEY)
        kid, aes = self._current
        head = _HEAD.pack(MARK, VERSION, kid)
        nonce = os.urandom(NONCE_LEN)
        return head + nonce + aes.encrypt(nonce, plaintext, head)

    def open(self, sealed: bytes) -> bytes:
        """The plaintext of a sealed payload; 409 ``encryption_key_unknown`` when no key of this
        process sealed it or it does not authenticate (never a 500, never the bytes)."""
        if len(sealed) < HEAD_LEN + NONCE_LEN + TAG_LEN:
            raise QueenError(ENCRYPTION_KEY_UNKNOWN, detail="a sealed payload is truncated")
        mark, version, kid = _HEAD.unpack_from(sealed)
        aes = self._keys.get(kid) if mark == MARK and version == VERSION else None
        if aes is None:
            raise QueenError(
                ENCRYPTION_KEY_UNKNOWN,
                detail=f"a payload is sealed with key id {kid.hex()}, which is neither QUEEN_ENCRYPTION_KEY nor "
                "in QUEEN_ENCRYPTION_KEYS_OLD",
            )
        nonce = sealed[HEAD_LEN : HEAD_LEN + NONCE_LEN]
        try:
            return aes.decrypt(nonce, sealed[HEAD_LEN + NONCE_LEN :], sealed[:HEAD_LEN])
        except InvalidTag:
            raise QueenError(
                ENCRYPTION_KEY_UNKNOWN, detail=f"a payload sealed with key id {kid.hex()} does not authenticate"
            ) from None

    def clear(self, payload: bytes) -> bytes:
        """``payload`` as JSON text: opened when sealed, as it is otherwise."""
        return self.open(payload) if is_sealed(payload) else payload

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

    def seal_for(self, tenant: str, queue: str, payload: bytes) -> tuple[bytes, bool]:
        """The payload as it is to be stored in ``queue`` by the cache's belief, and whether sealed."""
        if self.encrypted(tenant, queue):
            return self.seal(payload), True
        return payload, False


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


def opened(v: Vault | None, frame: _Framed) -> bytes:
    """A frame's payload as JSON text: opened with ``v`` when the frame is sealed (flag 4)."""
    if not frame.sealed:
        return frame.payload
    return (v or _NO_KEYS).open(frame.payload)


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
