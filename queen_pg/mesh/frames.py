"""The mesh frame: small, length-prefixed, HMAC-SHA256-signed.

Layout (big-endian)::

    u32 length        bytes that follow (header rest + body + mac)
    u8  version       FRAME_VERSION
    u8  kind          HELLO, WAKE, MAINTENANCE, CONFIG, INTEREST (sibling workers only), PING, CHALLENGE
    u8  flags         RELAYED: a frame a worker re-sent to its siblings on the same host
    u64 sent_ms       sender's wall clock, ms since the epoch (frames older than MAX_AGE_S are dropped)
    ... body          JSON (orjson)
    32  mac           HMAC-SHA256(secret, version..body)

Every frame is signed, the handshake included, so a peer without the secret never gets a frame
through: the receiver counts it (by reason) and closes the connection. A replayed frame is at worst a
spurious wake (the mesh carries hints only) and only within MAX_AGE_S.

The handshake is a challenge-response (``queen_pg/mesh/node.py`` accepts, ``peers.py`` dials)::

    acceptor -> dialer   CHALLENGE {"node": A, "nonce": na}
    dialer -> acceptor   HELLO {"role": "dial", "node": D, "peer": A, "challenge": na, "nonce": nd, "pid"}
    acceptor -> dialer   HELLO {"role": "accept", "node": A, "peer": D, "challenge": nd, "pid", "idle"}

The nonces are fresh random per connection, so a captured HELLO answers no later challenge, and the
role and both node ids are signed with it, so the acceptor's answer cannot be reflected as a dialer's
HELLO (nor sent to another node). ``idle``: the acceptor's idle timeout; the dialer sends a PING when it
has written nothing for a third of it. Version 1 had no challenge (the dialer spoke first): a frame of
another version is refused as ``version`` before its body is read, and both sides log it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import struct
import time
from dataclasses import dataclass
from typing import Any

import orjson

FRAME_VERSION = 2  # 2: the challenge-response handshake (CHALLENGE, HELLO roles, PING)
HELLO, WAKE, MAINTENANCE, CONFIG, INTEREST, PING, CHALLENGE = 1, 2, 3, 4, 5, 6, 7
KINDS = frozenset((HELLO, WAKE, MAINTENANCE, CONFIG, INTEREST, PING, CHALLENGE))
RELAYED = 0x01
MAX_FRAME = 64 * 1024  # bytes after the length prefix
MAX_AGE_S = 30.0
_LEN = struct.Struct(">I")
_HEAD = struct.Struct(">BBBQ")
MAC_LEN = 32
MIN_FRAME = _HEAD.size + MAC_LEN
MAX_BODY = MAX_FRAME - MIN_FRAME
BODY_BUDGET = 48 * 1024  # bytes of keys per WAKE/CONFIG/INTEREST frame (a frame's body may hold 64 KiB)


class FrameError(Exception):
    """A frame that must not be acted on; ``reason`` is the metrics label. ``fatal``: the stream can
    no longer be trusted or re-synchronised, close the connection."""

    def __init__(self, reason: str, fatal: bool = True, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.fatal = fatal


@dataclass(frozen=True, slots=True)
class Frame:
    kind: int
    flags: int
    sent_ms: int
    body: Any


def _mac(secret: bytes, signed: bytes) -> bytes:
    return hmac.new(secret, signed, hashlib.sha256).digest()


def encode(kind: int, body: Any, secret: bytes, flags: int = 0, now_ms: int | None = None) -> bytes:
    payload = orjson.dumps(body)
    if len(payload) > MAX_BODY:
        raise ValueError(f"mesh frame body of {len(payload)} bytes exceeds {MAX_BODY}")
    sent = int(time.time() * 1000) if now_ms is None else now_ms
    signed = _HEAD.pack(FRAME_VERSION, kind, flags, sent) + payload
    return _LEN.pack(len(signed) + MAC_LEN) + signed + _mac(secret, signed)


def decode(data: bytes, secret: bytes, now_ms: int | None = None) -> Frame:
    """One frame without its length prefix (what :func:`read_frame` read)."""
    if len(data) < MIN_FRAME:
        raise FrameError("malformed")
    signed, mac = data[:-MAC_LEN], data[-MAC_LEN:]
    if not hmac.compare_digest(mac, _mac(secret, signed)):
        raise FrameError("bad_mac")
    version, kind, flags, sent = _HEAD.unpack_from(signed)
    if version != FRAME_VERSION:
        said = f"the peer speaks mesh frame version {version}, this replica {FRAME_VERSION}"
        raise FrameError("version", detail=said)
    if kind not in KINDS:
        raise FrameError("unknown_kind", fatal=False)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if abs(now - sent) > MAX_AGE_S * 1000:
        raise FrameError("stale", fatal=False)
    try:
        body = orjson.loads(signed[_HEAD.size :])
    except orjson.JSONDecodeError:
        raise FrameError("malformed") from None
    return Frame(kind, flags, sent, body)


async def read_frame(reader: asyncio.StreamReader, secret: bytes) -> Frame | None:
    """The next frame of the stream; None at a clean end of stream (between frames)."""
    try:
        head = await reader.readexactly(_LEN.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError("truncated") from None
    (length,) = _LEN.unpack(head)
    if length > MAX_FRAME:
        raise FrameError("oversize")
    if length < MIN_FRAME:
        raise FrameError("malformed")
    try:
        data = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise FrameError("truncated") from None
    return decode(data, secret)


def same(value: Any, expected: str) -> bool:
    """Whether a received handshake field equals ``expected`` (constant time; any other type: no)."""
    return isinstance(value, str) and hmac.compare_digest(value.encode(), expected.encode())


# ---- bodies of the key-carrying kinds -----------------------------------------------------------


def key_frames(kind: int, secret: bytes, keys: Any) -> list[bytes]:
    """WAKE or CONFIG frames carrying ``keys`` ((tenant, queue) pairs), as many as BODY_BUDGET needs."""
    out: list[bytes] = []
    chunk: list[list[str]] = []
    size = 0
    for t, q in keys:
        chunk.append([t, q])
        size += len(t) + len(q) + 8
        if size >= BODY_BUDGET:
            out.append(encode(kind, chunk, secret))
            chunk, size = [], 0
    if chunk:
        out.append(encode(kind, chunk, secret))
    return out


def interest_frames(
    secret: bytes, adds: dict[tuple[str, str], float], drops: set[tuple[str, str]], full: bool
) -> list[bytes]:
    """INTEREST frames (sibling workers): ``{"full", "add": [[t, q, since]], "drop": [[t, q]]}``;
    ``full`` replaces what the sibling knows of the sender (set on the first frame only)."""
    out: list[bytes] = []
    body: dict[str, Any] = {"full": full, "add": [], "drop": []}
    size = 0
    items: list[tuple[str, list[Any], int]] = [("drop", [t, q], len(t) + len(q)) for t, q in drops]
    items += [("add", [t, q, since], len(t) + len(q)) for (t, q), since in adds.items()]
    for part, item, n in items:
        body[part].append(item)
        size += n + 32
        if size >= BODY_BUDGET:
            out.append(encode(INTEREST, body, secret))
            body, size = {"full": False, "add": [], "drop": []}, 0
    if size or not out:
        out.append(encode(INTEREST, body, secret))
    return out


def interest_ok(body: Any) -> bool:
    """Whether an INTEREST body has the shape :func:`interest_frames` writes."""
    return (
        isinstance(body, dict)
        and isinstance(body.get("full"), bool)
        and isinstance(body.get("add"), list)
        and isinstance(body.get("drop"), list)
        and all(
            isinstance(k, list)
            and len(k) == 3
            and isinstance(k[0], str)
            and isinstance(k[1], str)
            and isinstance(k[2], int | float)
            for k in body["add"]
        )
        and all(isinstance(k, list) and len(k) == 2 and all(isinstance(x, str) for x in k) for k in body["drop"])
    )
