"""Bytes a request expands to when the broker decodes it (zstd timer payloads, base64, zstd binary pushes)
are bounded per request by QUEEN_MAX_DECODED_BYTES and charged to the admission budget before they exist.

A body of a few KiB whose zstd payloads would each inflate to megabytes is refused 413
``decoded_too_large`` before it is inflated: against a real ``queen-pg serve`` process its peak RSS
(VmHWM) stays within the cap, and nothing is written. A legitimate compressed payload under the cap
still works, its decoded bytes are held in the admission budget while the request runs, and a big
one is decoded off the event loop (``/health`` answers while it runs, delayed at most by one JSON check).
"""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
import zstandard
from queen.http.push_binary import PushBatch, encode_push_binary, encode_push_frames, encode_transaction_frames

from queen_pg.settings import MIB
from tests.conftest import Broker
from tests.helpers import until
from tests.serve_process import ServeProcess

CAP = 16 * MIB
PUSH_TYPE = {"content-type": "application/x-queen-push"}


def spaces(size: int) -> bytes:
    """A JSON document of ``size`` bytes that zstd shrinks a thousandfold: ``0`` and whitespace."""
    return b"0" + b" " * (size - 1)


def zstd(raw: bytes, *, declared: bool = True) -> bytes:
    if declared:
        return zstandard.ZstdCompressor(level=3).compress(raw)
    z = zstandard.ZstdCompressor(level=3, write_content_size=False).compressobj()
    return z.compress(raw) + z.flush()


def timer(queue: str, key: str, payload: bytes, *, compressed: bool = True) -> dict[str, Any]:
    op: dict[str, Any] = {
        "op": "schedule",
        "queue": queue,
        "timerKey": key,
        "payload": base64.b64encode(payload).decode(),
        "delayMs": 3_600_000,
    }
    if compressed:
        op["payloadZstd"] = True
    return op


def bombs() -> dict[str, tuple[str, dict[str, str], bytes]]:
    """name -> (path, headers, body): each decodes to far more than CAP, each is a few KiB."""
    declared = zstd(spaces(CAP))
    undeclared = zstd(spaces(CAP), declared=False)
    eight = [timer("bomb", f"k{i}", declared) for i in range(8)]
    frames = [PushBatch("bomb", f"p{i}", [spaces(CAP)]) for i in range(8)]
    as_json = {"content-type": "application/json"}
    return {
        "timers: 8 ops of CAP each": ("/api/v1/timers", as_json, orjson.dumps({"operations": eight})),
        "timers: one op of 2 x CAP": (
            "/api/v1/timers",
            as_json,
            orjson.dumps({"operations": [timer("bomb", "big", zstd(spaces(2 * CAP)))]}),
        ),
        "timers: frames without a content size": (
            "/api/v1/timers",
            as_json,
            orjson.dumps({"operations": [timer("bomb", f"u{i}", undeclared) for i in range(8)]}),
        ),
        "transaction: a timers rider of 8 x CAP": ("/api/v1/transaction", as_json, orjson.dumps({"timers": eight})),
        "binary push: 8 groups of CAP frames": ("/api/v1/push", PUSH_TYPE, encode_push_frames(frames)),
        "binary push: a zstd body of 2 x CAP": (
            "/api/v1/push",
            PUSH_TYPE,
            encode_push_binary([PushBatch("bomb", "p", [spaces(2 * CAP)])], compress=True),
        ),
        "binary transaction: 8 groups of CAP frames": (
            "/api/v1/transaction",
            PUSH_TYPE,
            encode_transaction_frames(b"{}", frames),
        ),
    }


async def written(conn: asyncpg.Connection) -> tuple[int, int, int]:
    timers = await conn.fetchval("SELECT count(*) FROM queen.timers")
    segments = await conn.fetchval("SELECT count(*) FROM queen.log_segments")
    queues = await conn.fetchval("SELECT count(*) FROM queen.queues WHERE name = 'bomb'")
    return int(timers), int(segments), int(queues)


async def test_decode_bombs_are_413_before_they_inflate(db_url: str, conn: asyncpg.Connection, tmp_path: Path) -> None:
    broker = ServeProcess(db_url, tmp_path / "broker.log", QUEEN_MAX_DECODED_BYTES=str(CAP))
    await broker.start()
    try:
        async with httpx.AsyncClient(base_url=broker.url, timeout=60) as http:
            # warm: one legitimate compressed timer and one compressed binary push, so the baseline
            # holds what serving them costs
            r = await http.post("/api/v1/timers", json={"operations": [timer("warm", "k", zstd(b'{"a":1}'))]})
            assert r.status_code == 200 and r.json()["results"][0]["ok"] is True, r.text
            body = encode_push_binary([PushBatch("warm", "p", [b'{"a":1}'])], compress=True)
            assert (await http.post("/api/v1/push", content=body, headers=PUSH_TYPE)).status_code == 201
            before = await written(conn)
            baseline = broker.peak_kib()
            for name, (path, headers, body) in bombs().items():
                assert len(body) < 256 * 1024, (name, len(body))
                r = await http.post(path, content=body, headers=headers)
                assert r.status_code == 413, (name, r.status_code, r.text[:300])
                assert r.json()["code"] == "decoded_too_large", (name, r.text[:300])
                assert str(CAP) in r.text, (name, r.text[:300])
                grown = (broker.peak_kib() - baseline) * 1024
                # the first of 8 frames that declare no size is within the cap: decoded, then the next refused
                assert grown < CAP + 8 * MIB, f"{name}: peak RSS grew {grown / MIB:.0f} MiB (cap {CAP // MIB} MiB)"
                assert await written(conn) == before, name
            assert (await http.get("/health")).status_code == 200
    finally:
        broker.kill()


def floats(size: int) -> bytes:
    """A JSON array of about ``size`` bytes that is slow to check (float parsing and formatting)."""
    return b"[" + b",".join(b"%.17g" % (i * 1.000000123456789) for i in range(size // 20)) + b"]"


async def test_health_answers_while_a_big_payload_is_decoded(
    db_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    """Base64 and zstd run in a worker thread without the GIL; the JSON check runs there too, but msgspec
    and orjson hold the GIL for each call, so the loop still waits for the longest one (~0.3 s here)
    instead of the whole decode (~0.6 s on the loop before: /health then took 0.56 s)."""
    payload = floats(24 * MIB)  # ~0.1 s to inflate, ~0.5 s to check as JSON on this kind of host
    broker = ServeProcess(db_url, tmp_path / "broker.log")
    await broker.start()
    try:
        async with httpx.AsyncClient(base_url=broker.url, timeout=60) as http:
            assert (await http.get("/health")).status_code == 200
            started = time.monotonic()
            big = asyncio.create_task(
                http.post("/api/v1/timers", json={"operations": [timer("big", "k", zstd(payload))]})
            )
            slowest, answered = 0.0, 0
            while not big.done():  # ping until the big request's answer arrives
                t = time.monotonic()
                assert (await http.get("/health")).status_code == 200
                slowest = max(slowest, time.monotonic() - t)
                answered += 1 if not big.done() else 0
            r = await big
            took = time.monotonic() - started
            assert r.status_code == 200 and r.json()["results"][0]["ok"] is True, r.text[:300]
            # Relative, not timed: the loop served /health several times during the request, and no /health
            # waited for most of it (decoded on the loop, one /health waited for the whole decode).
            assert answered >= 3, f"only {answered} /health answers while the payload was decoded ({took:.2f}s)"
            assert slowest < 0.8 * took, f"/health took {slowest:.2f}s of the request's {took:.2f}s"
        stored = await conn.fetchval("SELECT octet_length(payload) FROM queen.timers WHERE timer_key = 'k'")
        assert stored == len(payload)
    finally:
        broker.kill()


async def test_decoded_bytes_are_held_in_the_admission_budget(start_broker: Any, conn: asyncpg.Connection) -> None:
    """A timers request holds its decoded bytes in the admission budget until it has answered (seen
    while its write waits on a table lock held here), then gives them back."""
    b: Broker = await start_broker(max_decoded_bytes=CAP)
    budget = b.app.state.queen.admission
    size = 8 * MIB
    async with httpx.AsyncClient(base_url=b.url, timeout=60) as http:
        tx = conn.transaction()
        await tx.start()
        await conn.execute("LOCK TABLE queen.timers IN EXCLUSIVE MODE")
        try:
            call = asyncio.create_task(
                http.post("/api/v1/timers", json={"operations": [timer("held", "k", zstd(spaces(size)))]})
            )

            async def waits() -> bool:
                assert not call.done(), (await call).text
                n = await conn.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'queen.timers'::regclass"
                )
                return bool(n)

            await until(waits, "the timers write to wait on the lock")
            assert budget.sem.used >= size, budget.snapshot()
        finally:
            await tx.rollback()
        r = await call
        assert r.status_code == 200 and r.json()["results"][0]["ok"] is True, r.text
        assert budget.sem.used == 0, budget.snapshot()


async def test_compressed_payloads_under_the_cap_still_work(start_broker: Any, conn: asyncpg.Connection) -> None:
    b: Broker = await start_broker(max_decoded_bytes=CAP)
    doc = orjson.dumps({"big": "x" * (4 * MIB)})
    async with httpx.AsyncClient(base_url=b.url, timeout=60) as http:
        undeclared = timer("ok", "u", zstd(doc, declared=False))
        r = await http.post("/api/v1/timers", json={"operations": [timer("ok", "d", zstd(doc)), undeclared]})
        assert r.status_code == 200 and [x["ok"] for x in r.json()["results"]] == [True, True], r.text[:300]
        assert (await http.get("/api/v1/timers/ok/u")).json()["data"] == {"big": "x" * (4 * MIB)}
        r = await http.post("/api/v1/transaction", json={"timers": [timer("ok", "t", zstd(doc))]})
        assert r.status_code == 200 and r.json()["success"] is True, r.text[:300]
        plain = [timer("ok", f"p{i}", doc, compressed=False) for i in range(3)]  # base64 alone: 12 MiB
        r = await http.post("/api/v1/timers", json={"operations": plain})
        assert r.status_code == 200, r.text[:300]
        frames = encode_push_frames([PushBatch("ok", f"p{i}", [doc]) for i in range(3)])
        assert (await http.post("/api/v1/push", content=frames, headers=PUSH_TYPE)).status_code == 201
        body = encode_push_binary([PushBatch("ok", "z", [doc, doc])], compress=True)
        assert (await http.post("/api/v1/push", content=body, headers=PUSH_TYPE)).status_code == 201
        tx = encode_transaction_frames(b"{}", [PushBatch("ok", "t", [doc], ["t1"])])
        r = await http.post("/api/v1/transaction", content=tx, headers=PUSH_TYPE)
        assert r.status_code == 200 and r.json()["success"] is True, r.text[:300]
    assert await conn.fetchval("SELECT count(*) FROM queen.timers") == 6
    assert b.app.state.queen.admission.sem.used == 0
