"""Attacks on the HTTP transport replayed against a real `queen-pg serve` process over real sockets: a
request head streamed without end (headers, or a request line that httptools builds by repeated
concatenation) is 431 once it passes QUEEN_MAX_HEAD_BYTES, before the parser holds it, so neither the
worker's memory nor other clients' latency follow it; a head under the cap is served, afresh for each
request of a connection. Connections refused before admission (401) close after their answer, and
silent ones give way at QUEEN_MAX_CONNECTIONS, so a token holder is still served (queen_pg/server.py)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson

from queen_pg.settings import MIB
from tests.serve_process import ServeProcess
from tests.test_security_jwt import AUD, ISS, SECRET, token

CAP = 64 * 1024  # QUEEN_MAX_HEAD_BYTES's default
WRITE = 64 * 1024  # the attack's write size
OFFERED = 200 * MIB  # what the head flood would send if nothing stopped it
JWT_ENV = {"JWT_ENABLED": "1", "JWT_SECRET": SECRET, "JWT_ISSUER": ISS, "JWT_AUDIENCE": AUD}


@contextlib.asynccontextmanager
async def serving(db_url: str, tmp_path: Path, **env: str) -> AsyncIterator[ServeProcess]:
    broker = ServeProcess(db_url, tmp_path / "broker.log", QUEEN_DRAIN_DELAY_MS="0", **env)
    await broker.start()
    try:
        yield broker
    finally:
        broker.kill()


async def stop(broker: ServeProcess) -> str:
    """SIGTERM, and the shutdown line the process logs (its transport's counters)."""
    broker.terminate()
    await asyncio.to_thread(broker.process.wait, 30)
    (line,) = [x for x in broker.log().splitlines() if "event=shutdown " in x]
    return line


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status, *lines = head[:-4].split(b"\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(b":") for x in lines)}
    body = await asyncio.wait_for(reader.readexactly(int(headers[b"content-length"])), 10)
    return int(status.split(b" ")[1]), headers, body


async def ask(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes
) -> tuple[int, dict[bytes, bytes], bytes]:
    writer.write(raw)
    await writer.drain()
    return await read_answer(reader)


def get(path: str, *extra: bytes) -> bytes:
    return b"GET " + path.encode() + b" HTTP/1.1\r\nhost: localhost\r\n" + b"".join(extra) + b"\r\n"


def padding(total: int) -> list[bytes]:
    """Header lines of about ``total`` bytes in all (1 KiB each)."""
    return [b"x-pad-%04d: %s\r\n" % (i, b"p" * 1000) for i in range(total // 1016)]


async def test_a_head_flood_is_431_and_closed_long_before_it_ends(db_url: str, tmp_path: Path) -> None:
    """One connection offers 200 MB of header lines in 64 KB writes (before: the worker grew by ~1.6 GB
    within the 10 s head deadline): it is answered 431 and closed after a few MB at most (what the
    sockets' buffers hold), and the worker's peak RSS does not move."""
    async with serving(db_url, tmp_path) as broker:
        reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
        assert (await ask(reader, writer, get("/health")))[0] == 200  # warm: this connection's first answer
        baseline = broker.peak_kib()
        line = b"x-flood: " + b"a" * (WRITE - 11) + b"\r\n"

        async def answer() -> bytes:
            out = b""
            with contextlib.suppress(ConnectionError):
                while chunk := await reader.read(65536):
                    out += chunk
            return out

        answered = asyncio.create_task(answer())
        sent = 0
        writer.write(b"GET /health HTTP/1.1\r\nhost: localhost\r\n")
        with contextlib.suppress(ConnectionError):
            while sent < OFFERED and not answered.done():
                writer.write(line)
                await writer.drain()  # the broker's pace: it blocks while the broker does not read
                sent += len(line)
        got = await asyncio.wait_for(answered, 30)
        writer.close()
        grown = (broker.peak_kib() - baseline) * 1024
        assert sent < 32 * MIB, f"{sent / MIB:.0f} MiB of head went in before the connection closed"
        assert grown <= 150 * MIB, f"peak RSS grew {grown / MIB:.0f} MiB"
        # the reset that answers bytes sent after the close may discard the 431 on the client's side:
        # the broker's own count says it was answered
        assert got == b"" or got.startswith(b"HTTP/1.1 431"), got[:200]
        if got:
            assert b'"code":"head_too_large"' in got and b"connection: close" in got.lower(), got[:400]
        assert "heads_too_large=1 " in await stop(broker)


def stream_request_lines(port: int, on: threading.Event, until: threading.Event, closed: list[int]) -> None:
    """The attacker: `GET /health?aaaa...` in 64 KB writes, reconnecting whenever the broker closes;
    ``on`` is set once 2 MiB went out."""
    piece = b"a" * WRITE
    sent = 0
    while not until.is_set():
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.settimeout(5)
            try:
                s.sendall(b"GET /health?")
                while not until.is_set():
                    s.sendall(piece)
                    sent += len(piece)
                    if sent >= 2 * MIB:
                        on.set()
            except OSError:
                closed.append(1)


async def test_streamed_request_lines_do_not_slow_health(db_url: str, tmp_path: Path) -> None:
    """Two connections stream a request line without end (before: httptools concatenated the URL at
    every read, and /health took 11-12 s or was 503): /health on a third answers 200 within 100 ms at p99."""
    async with serving(db_url, tmp_path) as broker:
        reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
        assert (await ask(reader, writer, get("/health")))[0] == 200
        on, done = threading.Event(), threading.Event()
        closed: list[int] = []
        attackers = [
            threading.Thread(target=stream_request_lines, args=(broker.port, on, done, closed), daemon=True)
            for _ in range(2)
        ]
        for t in attackers:
            t.start()
        took: list[float] = []
        try:
            assert await asyncio.to_thread(on.wait, 10), "the attackers could not send"
            for _ in range(50):
                t0 = time.perf_counter()
                status, _, _ = await asyncio.wait_for(ask(reader, writer, get("/health")), 2)
                took.append(time.perf_counter() - t0)
                assert status == 200
        finally:
            done.set()
            for t in attackers:
                await asyncio.to_thread(t.join, 10)
            writer.close()
        p99 = sorted(took)[math.ceil(0.99 * len(took)) - 1]
        assert p99 <= 0.1, f"/health p99 {p99 * 1000:.0f} ms under the attack"
        assert closed, "the streamed request lines were never cut"


async def test_a_head_under_the_cap_is_served_and_each_request_counts_afresh(db_url: str, tmp_path: Path) -> None:
    async with serving(db_url, tmp_path) as broker:
        reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
        near = padding(60 * 1024)  # ~60 KiB of headers
        # two heads of ~60 KiB on one keep-alive connection: 120 KiB in all, each under the cap
        for _ in range(2):
            status, headers, _ = await ask(reader, writer, get("/health", *near))
            assert status == 200 and headers.get(b"connection") != b"close"
        # a push whose ~60 KiB head and 100 KiB body arrive in one write, then a pipelined /health
        body = orjson.dumps({"items": [{"queue": "big-head", "payload": "x" * 100_000}]})
        push = (
            b"POST /api/v1/push HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
            + b"".join(near)
            + b"content-length: %d\r\n\r\n" % len(body)
            + body
        )
        writer.write(push + get("/health", *padding(40 * 1024)))
        assert (await read_answer(reader))[0] == 201
        assert (await read_answer(reader))[0] == 200
        # a body answered before it was read (415) is not taken for the next head
        xml = b"<x>" + b"x" * (300 * 1024) + b"</x>"
        writer.write(
            b"POST /api/v1/push HTTP/1.1\r\nhost: localhost\r\ncontent-type: text/xml\r\n"
            + b"content-length: %d\r\n\r\n" % len(xml)
        )
        assert (await read_answer(reader))[0] == 415
        assert (await ask(reader, writer, xml + get("/health", *near)))[0] == 200
        # one past the cap, sent in one write: 431 and closed
        status, headers, answer = await ask(reader, writer, get("/health", *padding(CAP + 4096)))
        assert status == 431 and headers[b"connection"] == b"close", answer
        assert orjson.loads(answer)["code"] == "head_too_large"
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


async def test_refused_connections_close_and_a_token_holder_is_served_at_the_cap(db_url: str, tmp_path: Path) -> None:
    """JWT on, QUEEN_MAX_CONNECTIONS=40 (before: 305 sockets answered 401 stayed in keep-alive for 75 s
    and an admin token then got 503): 40 connections answered 401 are closed by the broker after the
    answer; 40 silent ones fill the cap, and an admin token is still served."""
    async with serving(db_url, tmp_path, QUEEN_MAX_CONNECTIONS="40", **JWT_ENV) as broker:
        refused = [await asyncio.open_connection("127.0.0.1", broker.port) for _ in range(40)]
        for _, w in refused:
            w.write(get("/api/v1/resources/queues"))
        for r, _ in refused:
            status, headers, _ = await read_answer(r)
            assert status == 401 and headers[b"connection"] == b"close"
            assert await asyncio.wait_for(r.read(), 5) == b"", "a refused connection stays open"
        # the refused sockets are still open on this side; 40 more say nothing
        silent = [await asyncio.open_connection("127.0.0.1", broker.port) for _ in range(40)]
        admin = get("/api/v1/resources/queues", b"authorization: Bearer %s\r\n" % token("admin").encode())
        admins = []
        for _ in range(3):  # three admins in a row, each on a new connection, each served and kept
            r, w = await asyncio.open_connection("127.0.0.1", broker.port)
            status, _, answer = await ask(r, w, admin)
            assert status == 200, answer
            admins.append((r, w))
        for r, w in admins:
            assert (await ask(r, w, admin))[0] == 200
        # 40 more silent ones: each takes the place of an older silent one, never of a token holder's
        silent += [await asyncio.open_connection("127.0.0.1", broker.port) for _ in range(40)]
        for r, w in admins:
            assert (await ask(r, w, admin))[0] == 200
        # the oldest silent connection gave way, with a 503 it can read
        gone = await asyncio.wait_for(silent[0][0].read(), 5)
        assert gone.startswith(b"HTTP/1.1 503") and b'"code":"overloaded"' in gone, gone
        for _, w in refused + silent + admins:
            w.close()
        line = await stop(broker)
        assert "evicted_connections=43 " in line and "refused_connections=0 " in line, line
