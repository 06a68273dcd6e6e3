"""One write per answer (queen_pg/server.py ``OneWrite``): the response head leaves with the first body
chunk, so a push's answer is ONE ``send()`` (not two), with raw sockets against a real broker whose
connection transport is watched. A ``100 Continue`` still goes out first, on its own; a body that comes
later (a file read in a thread) gets its head at the end of the loop iteration, not at the body;
pipelined requests get their answers in order; a close sends a held head first."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from queen_pg.server import OneWrite
from tests.conftest import Broker
from tests.helpers import eventually

PUSH = b'{"items":[{"queue":"ow","partition":"p","payload":{"n":1}}]}'


class Watched:
    """A transport that records what is written to it (and writes it)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        if self.real is not None:
            self.real.write(data)

    def close(self) -> None:
        self.closed = True
        if self.real is not None:
            self.real.close()

    def is_closing(self) -> bool:
        return self.closed if self.real is None else bool(self.real.is_closing())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def request(method: str, path: str, body: bytes = b"", extra: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nhost: localhost\r\n".encode() + extra
    if body:
        head += b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
    return head + b"\r\n" + body


async def answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    low = head.lower()
    i = low.find(b"content-length: ")
    n = int(low[i + 16 : low.find(b"\r\n", i)])
    return head, await reader.readexactly(n)


async def watched_connection(broker: Broker) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Watched]:
    """A keep-alive connection (one request answered) whose server-side transport is then watched."""
    reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
    writer.write(request("GET", "/health"))
    head, _ = await answer(reader)
    assert head.startswith(b"HTTP/1.1 200")
    (proto,) = broker.server.server_state.connections
    watch = Watched(proto.transport)
    proto.transport = watch  # type: ignore[assignment]  # the next request cycles write through it
    return reader, writer, watch


async def test_a_push_answer_leaves_in_one_write(broker: Broker) -> None:
    reader, writer, watch = await watched_connection(broker)
    try:
        for n in range(2):  # and again on the same keep-alive connection
            watch.writes.clear()
            writer.write(request("POST", "/api/v1/push", PUSH))
            head, body = await answer(reader)
            assert head.startswith(b"HTTP/1.1 201")
            assert orjson.loads(body)[0]["status"] == "queued", n
            assert watch.writes == [head + body]  # head and body: ONE write
    finally:
        writer.close()


async def test_a_refusal_and_a_404_also_leave_in_one_write(broker: Broker) -> None:
    reader, writer, watch = await watched_connection(broker)
    try:
        writer.write(request("POST", "/api/v1/push", b'{"items":[]}'))  # refused by the body's schema
        head, body = await answer(reader)
        assert head.startswith(b"HTTP/1.1 400") and b"items" in body
        assert watch.writes == [head + body]
        watch.writes.clear()
        writer.write(request("GET", "/api/v1/no-such-route"))
        head, body = await answer(reader)
        assert head.startswith(b"HTTP/1.1 404")
        assert watch.writes == [head + body]
    finally:
        writer.close()


async def test_100_continue_goes_first_and_alone(broker: Broker) -> None:
    reader, writer, watch = await watched_connection(broker)
    try:
        head = request("POST", "/api/v1/push", PUSH, b"expect: 100-continue\r\n")
        writer.write(head[: -len(PUSH)])  # the head only: the body waits for the 100
        interim = await reader.readuntil(b"\r\n\r\n")
        assert interim.startswith(b"HTTP/1.1 100")
        writer.write(PUSH)
        final, body = await answer(reader)
        assert final.startswith(b"HTTP/1.1 201")
        assert watch.writes == [interim, final + body]
    finally:
        writer.close()


async def test_a_body_that_comes_later_gets_its_head_first(broker: Broker) -> None:
    # the dashboard's files are FileResponses: the body is read in a thread after the head is sent
    reader, writer, watch = await watched_connection(broker)
    try:
        writer.write(request("GET", "/"))
        head, body = await answer(reader)
        assert head.startswith(b"HTTP/1.1 200") and b"<html" in body.lower()
        assert b"".join(watch.writes) == head + body
        assert watch.writes[0] == head  # flushed at the end of its loop iteration, not held for the body
    finally:
        writer.close()


async def test_pipelined_requests_are_answered_in_order(broker: Broker) -> None:
    reader, writer, watch = await watched_connection(broker)
    try:
        writer.write(request("POST", "/api/v1/push", PUSH) + request("GET", "/api/v1/no-such-route"))
        first, body1 = await answer(reader)
        second, body2 = await answer(reader)
        assert first.startswith(b"HTTP/1.1 201") and second.startswith(b"HTTP/1.1 404")
        assert watch.writes == [first + body1, second + body2]
    finally:
        writer.close()


async def test_a_held_head_goes_out_at_the_end_of_the_iteration_or_before_a_close() -> None:
    loop = asyncio.get_running_loop()
    sink = Watched(None)
    ow = OneWrite(sink, loop)  # type: ignore[arg-type]
    ow.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert sink.writes == []  # held
    await eventually(lambda: sink.writes == [b"HTTP/1.1 200 OK\r\n\r\n"], "the held head to be flushed")
    ow.write(b"chunk")
    assert sink.writes[-1] == b"chunk"  # later writes go straight through

    sink2 = Watched(None)
    ow2 = OneWrite(sink2, loop)  # type: ignore[arg-type]
    ow2.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert sink2.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]  # never held
    ow2.write(b"HTTP/1.1 500 Internal Server Error\r\n\r\n")
    ow2.close()  # e.g. the app failed after the head: the head goes, then the close
    assert sink2.writes[-1] == b"HTTP/1.1 500 Internal Server Error\r\n\r\n" and sink2.closed


async def test_head_requests_pipelined_and_closing_get_their_heads_in_order(broker: Broker) -> None:
    # HEAD: uvicorn writes the head and never the body (the held head leaves at the end of the loop
    # iteration); a GET pipelined behind it must not overtake it, and a HEAD with Connection: close
    # gets its head before the close.
    reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
    try:
        writer.write(request("HEAD", "/health") + request("GET", "/health") + request("HEAD", "/health"))
        h1 = await reader.readuntil(b"\r\n\r\n")
        h2, body2 = await answer(reader)
        h3 = await reader.readuntil(b"\r\n\r\n")
        # (/health answers HEAD with 405 and a content-length, which a HEAD answer carries without a body)
        assert h1.startswith(b"HTTP/1.1 405") and h2.startswith(b"HTTP/1.1 200") and h3.startswith(b"HTTP/1.1 405")
        assert orjson.loads(body2)  # the GET's body, right after its own head (the HEADs sent none)
        writer.write(request("HEAD", "/health", extra=b"connection: close\r\n"))
        h4 = await reader.readuntil(b"\r\n\r\n")
        assert h4.startswith(b"HTTP/1.1 405") and b"connection: close" in h4.lower()
        assert await reader.read() == b""  # then the close, nothing else
    finally:
        writer.close()
