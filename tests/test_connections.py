"""Connection guards of the HTTP server (queen_pg/server.py), with raw sockets against a real broker,
for both of uvicorn's HTTP implementations: a client dribbling its request head (or sending nothing)
is answered 408 and closed once header_timeout_s has passed; a request that takes longer than that
(a long-poll) and the keep-alive request after it are untouched; beyond max_connections a new
connection is answered 503 + Retry-After and closed, and admitted again once one has gone."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import Broker
from tests.helpers import eventually

PROTOCOLS = ["queen_pg.server:QueenHttpToolsProtocol", "queen_pg.server:QueenH11Protocol"]


@pytest.fixture(params=PROTOCOLS, ids=["httptools", "h11"])
def guarded(request: pytest.FixtureRequest, start_broker: Callable[..., Any]) -> Callable[..., Any]:
    async def start(**overrides: Any) -> Broker:
        b: Broker = await start_broker(server={"http": request.param}, jobs_enabled=False, **overrides)
        return b

    return start


async def read_all(reader: asyncio.StreamReader) -> bytes:
    out = b""
    while chunk := await reader.read(65536):
        out += chunk
    return out


async def test_a_dribbling_head_is_closed_within_the_timeout(guarded: Callable[..., Any]) -> None:
    b = await guarded(header_timeout_s=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
    head = b"GET /health HTTP/1.1\r\nhost: localhost\r\nx-slow: " + b"a" * 1000
    t0 = time.monotonic()

    async def dribble() -> None:
        for byte in head:  # one byte every 20 ms: each byte is "activity", none completes the head
            if writer.is_closing():
                return
            writer.write(bytes([byte]))
            await asyncio.sleep(0.02)  # the client's pace, not a wait for the broker

    sender = asyncio.create_task(dribble())
    reset = False
    try:
        answer = await asyncio.wait_for(read_all(reader), 5)
    except ConnectionResetError:
        # the client kept dribbling after the broker answered 408 and closed: the kernel answers those
        # bytes with a reset, which may discard the unread 408 (the silent-client test checks the 408)
        answer, reset = b"", True
    closed_after = time.monotonic() - t0
    sender.cancel()
    writer.close()
    assert reset or answer.startswith(b"HTTP/1.1 408"), answer
    assert 0.4 <= closed_after < 2.0, closed_after


async def test_a_silent_connection_is_closed_within_the_timeout(guarded: Callable[..., Any]) -> None:
    b = await guarded(header_timeout_s=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
    t0 = time.monotonic()
    answer = await asyncio.wait_for(read_all(reader), 5)
    assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 2.0
    writer.close()
    await eventually(lambda: not b.server.server_state.connections, "the broker to forget the connection")


async def test_a_long_request_and_keep_alive_are_not_cut(guarded: Callable[..., Any]) -> None:
    b = await guarded(header_timeout_s=0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
    # a long-poll that lasts 3x the head timeout, then a second request on the same connection
    writer.write(b"GET /api/v1/pop/queue/none?wait=true&timeout=1000 HTTP/1.1\r\nhost: localhost\r\n\r\n")
    await writer.drain()
    first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert first.startswith(b"HTTP/1.1 204"), first
    writer.write(b"GET /health HTTP/1.1\r\nhost: localhost\r\n\r\n")
    await writer.drain()
    second = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert second.startswith(b"HTTP/1.1 200"), second
    writer.close()


async def health(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    """One /health on this connection: its answer's head (the body is read and dropped)."""
    writer.write(b"GET /health HTTP/1.1\r\nhost: localhost\r\n\r\n")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = next(
        int(v) for k, _, v in (h.partition(b":") for h in head.split(b"\r\n")) if k.lower() == b"content-length"
    )
    await asyncio.wait_for(reader.readexactly(length), 5)
    return head


async def test_connections_beyond_the_cap_are_refused_with_503(guarded: Callable[..., Any]) -> None:
    b = await guarded(max_connections=4)
    held = [await asyncio.open_connection("127.0.0.1", b.port) for _ in range(4)]
    for r, w in held:  # each has had a request admitted: none gives way to a newcomer
        assert (await health(r, w)).startswith(b"HTTP/1.1 200")
    await eventually(lambda: len(b.server.server_state.connections) == 4, "four connections")
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
    answer = await asyncio.wait_for(read_all(reader), 5)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 503"), answer
    assert b"retry-after: 1" in answer.lower() and b'"code":"overloaded"' in answer
    # a held connection still works
    r0, w0 = held[0]
    w0.write(b"GET /health HTTP/1.1\r\nhost: localhost\r\n\r\n")
    assert (await asyncio.wait_for(r0.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 200")
    # one goes: a new one is admitted
    _, w1 = held.pop()
    w1.close()
    await eventually(lambda: len(b.server.server_state.connections) == 3, "the broker to see it go")
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
    writer.write(b"GET /health HTTP/1.1\r\nhost: localhost\r\n\r\n")
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 200")
    writer.close()
    for _, w in held:
        w.close()


async def test_a_stalled_body_is_answered_408_and_frees_its_admission_bytes(guarded: Callable[..., Any]) -> None:
    """A Content-Length never sent held the connection and the admission bytes charged for it until the
    client went away (hostile sweep): four such pushes of 64 MiB filled the 256 MiB budget for good."""
    b = await guarded(body_idle_timeout_s=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
    writer.write(
        b"POST /api/v1/push HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
        b"content-length: 1000000\r\n\r\n" + b'{"items": [{"queue": "q", "payload": "' + b"x" * 100
    )
    await writer.drain()
    t0 = time.monotonic()
    answer = await asyncio.wait_for(read_all(reader), 5)
    assert answer.startswith(b"HTTP/1.1 408") and b'"code":"request_timeout"' in answer, answer
    assert 0.4 <= time.monotonic() - t0 < 2.0
    writer.close()
    budget = b.app.state.queen.admission
    await eventually(lambda: budget.sem.used == 0, "the admission bytes to be released")
    assert b.app.state.queen.transport.body_timeouts == 1


async def test_a_body_sent_slowly_but_steadily_is_not_cut(guarded: Callable[..., Any]) -> None:
    b = await guarded(body_idle_timeout_s=0.3)
    body = b'{"items": [{"queue": "q", "payload": 1}]}'
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
    writer.write(b"POST /api/v1/push HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n")
    writer.write(b"content-length: %d\r\n\r\n" % len(body))
    for i in range(0, len(body), 8):  # 6 chunks 0.2 s apart: 1 s in all, each gap under the timeout
        writer.write(body[i : i + 8])
        await writer.drain()
        await asyncio.sleep(0.2)  # the client's pace, not a wait for the broker
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 201"), head
    writer.close()


async def test_at_the_cap_a_newcomer_takes_the_place_of_the_oldest_silent_connection(
    guarded: Callable[..., Any],
) -> None:
    """Connections that never had a request admitted cannot lock a client out: at the cap the oldest of
    them (no request in flight) is answered 503 and closed for the newcomer; a connection that has had a
    request admitted is never closed so."""
    b = await guarded(max_connections=4)
    proven = await asyncio.open_connection("127.0.0.1", b.port)
    assert (await health(*proven)).startswith(b"HTTP/1.1 200")
    silent = [await asyncio.open_connection("127.0.0.1", b.port) for _ in range(3)]
    await eventually(lambda: len(b.server.server_state.connections) == 4, "four connections")
    for n in range(3):  # each newcomer is served; the silent ones go, oldest first
        r, w = await asyncio.open_connection("127.0.0.1", b.port)
        assert (await health(r, w)).startswith(b"HTTP/1.1 200")
        answer = await asyncio.wait_for(read_all(silent[n][0]), 5)
        assert answer.startswith(b"HTTP/1.1 503") and b'"code":"overloaded"' in answer, answer
        silent.append((r, w))  # proven now
    assert (await health(*proven)).startswith(b"HTTP/1.1 200")
    # every connection has proven itself: a newcomer is refused
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
    assert (await asyncio.wait_for(read_all(reader), 5)).startswith(b"HTTP/1.1 503")
    writer.close()
    transport = b.app.state.queen.transport
    assert transport.evicted_connections == 3 and transport.refused_connections == 1
    for _, w in [proven, *silent]:
        w.close()


def pad(total: int) -> bytes:
    """Header lines of ``total`` bytes (give or take one line)."""
    return b"".join(b"x-pad-%03d: %s\r\n" % (i, b"p" * 500) for i in range(total // 513))


async def test_a_head_past_the_cap_is_431_and_closed(guarded: Callable[..., Any]) -> None:
    b = await guarded(max_head_bytes=8192)
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
    near = b"GET /health HTTP/1.1\r\nhost: localhost\r\n" + pad(7600) + b"\r\n"
    assert 7000 < len(near) < 8192
    for _ in range(2):  # each head of a keep-alive connection is counted afresh
        writer.write(near)
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 200")
        await reader.readuntil(b"}")
    writer.write(near + near)  # pipelined, in one write
    for _ in range(2):
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 200")
        await reader.readuntil(b"}")
    writer.write(b"GET /health HTTP/1.1\r\nhost: localhost\r\n" + pad(9000))  # past the cap, not yet complete
    answer = await asyncio.wait_for(read_all(reader), 5)
    assert answer.startswith(b"HTTP/1.1 431") and b'"code":"head_too_large"' in answer, answer
    assert b"connection: close" in answer
    writer.close()
    assert b.app.state.queen.transport.heads_too_large == 1


async def test_a_pipelined_head_past_the_cap_behind_a_long_poll_is_431(guarded: Callable[..., Any]) -> None:
    """The head of a request pipelined behind a parked long-poll is counted too (httptools parses it while
    the pop waits; h11 holds it until the pop has answered)."""
    b = await guarded(max_head_bytes=8192)
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
    writer.write(b"GET /api/v1/pop/queue/none?wait=true&timeout=300 HTTP/1.1\r\nhost: localhost\r\n\r\n")
    await eventually(lambda: len(b.server.server_state.tasks) == 1, "the pop to be running")

    async def answer() -> bytes:
        with contextlib.suppress(ConnectionError):  # the reset of bytes sent after the close
            return await read_all(reader)
        return b""

    answered = asyncio.create_task(answer())
    writer.write(b"GET /health HTTP/1.1\r\nhost: localhost\r\n")
    with contextlib.suppress(ConnectionError):
        for _ in range(500):  # 500 KiB offered, a line every 5 ms
            if answered.done():
                break
            writer.write(b"x-pad: " + b"p" * 1015 + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.005)  # the client's pace, not a wait for the broker
    got = await asyncio.wait_for(answered, 5)
    writer.close()
    assert b.app.state.queen.transport.heads_too_large == 1
    assert got == b"" or b"HTTP/1.1 431" in got, got
