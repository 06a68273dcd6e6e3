"""queen_pg.server.Coalesced: the writes one event-loop step makes leave as one send() (a response's head
and body, which uvicorn writes apart), in order; close/write_eof send what is pending first, abort drops
it; nothing is written to a closing transport. Then over real HTTP, through the guarded protocol that
wraps every connection's transport: keep-alive answers (/health, a JSON pop) arrive whole and in order."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from queen_pg.server import Coalesced
from tests.conftest import Broker
from tests.helpers import push


class Recorder(asyncio.Transport):
    """A transport that records what reaches it (the socket side of Coalesced)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[bytes] = []
        self.events: list[str] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.sent.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.events.append("close")
        self.closing = True

    def write_eof(self) -> None:
        self.events.append("eof")

    def abort(self) -> None:
        self.events.append("abort")
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


async def test_writes_of_one_step_leave_as_one_send_in_order() -> None:
    rec = Recorder()
    t = Coalesced(rec, asyncio.get_running_loop())
    t.write(b"HTTP/1.1 200 OK\r\n\r\n")
    t.write(memoryview(b"body"))
    t.write(b"")
    assert rec.sent == [] and t.get_write_buffer_size() == len(b"HTTP/1.1 200 OK\r\n\r\nbody")
    await asyncio.sleep(0)
    assert rec.sent == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    t.writelines([b"a", b"b"])
    await asyncio.sleep(0)
    t.write(b"c")
    await asyncio.sleep(0)
    assert rec.sent[1:] == [b"ab", b"c"]
    assert t.get_extra_info("peername") == ("127.0.0.1", 1)  # the rest is the transport's


async def test_close_and_eof_send_what_is_pending_first_and_abort_drops_it() -> None:
    rec = Recorder()
    t = Coalesced(rec, asyncio.get_running_loop())
    t.write(b"last words")
    t.write_eof()
    assert rec.sent == [b"last words"] and rec.events == ["eof"]
    t.write(b"bye")
    t.close()
    assert rec.sent[-1] == b"bye" and rec.events == ["eof", "close"]
    await asyncio.sleep(0)
    assert len(rec.sent) == 2  # nothing sent twice by the scheduled step

    rec2 = Recorder()
    t2 = Coalesced(rec2, asyncio.get_running_loop())
    t2.write(b"never")
    t2.abort()
    await asyncio.sleep(0)
    assert rec2.sent == [] and rec2.events == ["abort"]


async def test_a_closing_transport_gets_nothing_and_big_writes_are_not_held() -> None:
    rec = Recorder()
    t = Coalesced(rec, asyncio.get_running_loop())
    t.write(b"x")
    rec.closing = True  # the peer went away before the step ran
    await asyncio.sleep(0)
    assert rec.sent == []
    rec.closing = False
    t.write(b"head")
    big = b"y" * (Coalesced.MAX + 1)
    t.write(big)  # beyond the bound: what is pending goes first, then the big write as it is
    assert rec.sent == [b"head", big]
    await asyncio.sleep(0)
    assert rec.sent == [b"head", big]


async def _raw_get(port: int, path: str, times: int) -> list[bytes]:
    """GETs on one keep-alive connection; each answer as the FIRST read after the request got it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    firsts = []
    try:
        for _ in range(times):
            writer.write(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
            await writer.drain()
            firsts.append(await reader.read(1 << 20))
    finally:
        writer.close()
    return firsts


async def test_a_response_arrives_whole_in_one_read(broker: Broker, http: httpx.AsyncClient) -> None:
    for _ in range(3):
        firsts = await _raw_get(broker.port, "/health", 3)
        for got in firsts:
            head, _, body = got.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), got
            length = int(next(v for k, v in (h.split(b": ", 1) for h in head.split(b"\r\n")[1:])
                              if k.lower() == b"content-length"))  # fmt: skip
            assert len(body) == length, got  # head and body in the first read
    await push(http, "q", [{"payload": {"i": i}} for i in range(20)])
    firsts = await _raw_get(broker.port, "/api/v1/pop/queue/q?batch=20&wait=false", 1)
    head, _, body = firsts[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and body.startswith(b'{"success":true') and body.endswith(b"}")
