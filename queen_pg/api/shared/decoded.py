"""What a request expands to when the broker decodes it: bounded per request, charged to the admission
budget before it exists, decoded off the event loop when big.

Client bytes that grow when decoded: the zstd (``payloadZstd``) and base64 payloads of timer operations
(``POST /api/v1/timers``, a transaction's ``timers``) and the zstd groups and bodies of binary pushes and
transactions (``application/x-queen-push``). A few KiB of zstd can declare (or, without a declared size,
hold) gigabytes. Per request, :class:`Expansion` counts the bytes they decode to against
``QUEEN_MAX_DECODED_BYTES`` (413 ``decoded_too_large`` beyond it) and takes them from the admission byte
budget (``admission.py``, 429 ``overloaded`` when it has no room) BEFORE they are produced: what frames
declare is counted and charged before anything is inflated; frames that declare no size (or follow
the declared one) are measured first, a step at a time and kept nowhere, never past the cap, then
charged, then inflated. So a bomb is refused before it inflates, and the decoded bytes of all requests
in flight stay within the budget.
They go back to the budget when the request ends. Base64 shrinks (3 bytes per 4), so its decoding is
bounded by the body limit; its result is counted like an inflated payload.

Decoding many bytes takes milliseconds (zstd ~1 GB/s, checking JSON ~50 MB/s). From
:data:`OFF_LOOP_BYTES` on it runs in a worker thread, so the event loop keeps serving (``/health``,
pops, acks); below it, inline as before (a thread hop costs tens of microseconds).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

import zstandard
from fastapi import Request

from queen_pg.api.shared.admission import GROW_HOLD_S, ByteBudget, tenant_of
from queen_pg.engine.codec import dctx
from queen_pg.errors import DECODED_TOO_LARGE, QueenError

T = TypeVar("T")

OFF_LOOP_BYTES = 256 * 1024  # decoding this much or more runs in a worker thread
STEP = 1 << 20  # a frame without a declared size is measured in steps of this many bytes
FRAME_HEADER_MAX = 18  # ZSTD_FRAMEHEADERSIZE_MAX: the bytes that hold a frame's declared content size


def declared_size(frame: bytes) -> int | None:
    """The content size the first zstd frame of ``frame`` declares (its header suffices), or None:
    not declared, or not a zstd frame header (the decoding then says what is wrong)."""
    try:
        size = zstandard.frame_content_size(frame[:FRAME_HEADER_MAX])
    except zstandard.ZstdError:
        return None
    return None if size < 0 else int(size)


async def off_loop(size: int, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)``, in a worker thread when it decodes ``size`` bytes or more."""
    if size >= OFF_LOOP_BYTES:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


@dataclass(slots=True)
class Expansion:
    """The decoded bytes of one request: counted against ``cap``, held in ``budget`` until :meth:`close`."""

    cap: int
    budget: ByteBudget | None
    tenant: str | None
    family: str
    used: int = 0  # decoded bytes counted so far
    charged: int = 0  # bytes held in the admission budget

    def too_large(self, what: str, total: int) -> QueenError:
        return QueenError(DECODED_TOO_LARGE, detail=f"{what} decodes to {total} bytes or more", limit=self.cap)

    def check(self, n: int, what: str) -> None:
        """413 when ``n`` more decoded bytes would pass the cap (nothing counted)."""
        if self.used + n > self.cap:
            raise self.too_large(what, self.used + n)

    async def reserve(self, n: int, what: str) -> None:
        """Count ``n`` more decoded bytes and take them from the admission budget, before decoding them."""
        self.check(n, what)
        self.used += n
        if self.budget is not None and n > 0:
            # a short wait, as a chunked body's growth: requests holding bytes could wait on each other
            await self.budget.acquire(n, self.family, min(self.budget.hold_s, GROW_HOLD_S), self.tenant)
            self.charged += n

    def close(self) -> None:
        if self.budget is not None and self.charged:
            self.budget.release(self.charged, self.tenant)
        self.charged = 0

    async def inflate(self, data: bytes, what: str) -> bytes:
        """Every zstd frame of ``data``, decompressed, as one bytes object (no second copy). What the first
        frame declares is counted and charged, then read; when it declares nothing, or more frames follow,
        the frames are first measured in steps (never past the cap, nothing kept), then charged, then read.
        Raises ``zstandard.ZstdError`` when ``data`` is not zstd."""
        size = declared_size(data)
        counted = 0
        if size is not None:
            await self.reserve(size, what)
            out, more = await off_loop(size, _read, data, size)
            if not more:
                return out  # all of it (a frame cut short: what it holds)
            del out
            counted = size
        room = counted + self.cap - self.used  # what this payload may decode to
        total = await asyncio.to_thread(_measure, data, room)  # how much it holds can only be told by inflating
        if total > room:
            raise self.too_large(what, self.used - counted + total)
        await self.reserve(total - counted, what)
        out, _ = await off_loop(total, _read, data, total)
        return out


def _read(data: bytes, size: int) -> tuple[bytes, bool]:
    """The first ``size`` decompressed bytes of ``data``'s frames, and whether more follow."""
    with dctx().stream_reader(data, read_across_frames=True) as reader:
        out: bytes = reader.read(size)
        return out, bool(reader.read(1))


def _measure(data: bytes, limit: int) -> int:
    """The decompressed size of ``data``'s frames, read in steps and dropped; at most ``limit`` + 1."""
    n = 0
    with dctx().stream_reader(data, read_across_frames=True) as reader:
        while n <= limit:
            chunk = reader.read(min(STEP, limit + 1 - n))
            if not chunk:
                break
            n += len(chunk)
    return n


def _cap(request: Request) -> tuple[int, ByteBudget | None]:
    st = getattr(request.app.state, "queen", None)
    settings = getattr(st, "settings", None)
    cap = settings.decoded_cap if settings is not None else 0
    return cap, getattr(st, "admission", None)


@asynccontextmanager
async def expansion(request: Request, family: str) -> AsyncIterator[Expansion]:
    """The request's :class:`Expansion`; its bytes go back to the admission budget on exit."""
    cap, budget = _cap(request)
    exp = Expansion(cap, budget, tenant_of(request.scope), family)
    try:
        yield exp
    finally:
        exp.close()
