"""The mesh handshake against a listener on the path: real meshes on loopback TCP, and raw sockets
that replay what a recording proxy saw pass between them. A captured HELLO (the dialer's, or the
acceptor's answer reflected back) takes no authenticated place however often it is replayed, the
real peer still joins and its wakes still arrive at once; one node id holds one connection (the newer
replaces the older); an authenticated connection that says nothing for the idle timeout is dropped,
while a live idle peer keeps its connection through its pings; an old-version peer is refused with a
log line."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import struct
import time
from typing import Any

from queen_pg.mesh import frames
from queen_pg.mesh.node import Mesh, MeshConfig
from tests.conftest import free_port
from tests.helpers import eventually

SECRET = b"s3cret"


def _mesh(port: int, peers: list[int] = (), **more: Any) -> tuple[Mesh, asyncio.Event]:  # type: ignore[assignment]
    heard = asyncio.Event()
    cfg = MeshConfig(secret=SECRET, port=port, peers=tuple(("127.0.0.1", p) for p in peers), **more)
    return Mesh(cfg, on_wake=lambda t, q: heard.set()), heard


async def _running(*meshes: Mesh) -> list[asyncio.Task[None]]:
    tasks = []
    for m in meshes:
        await m.start()
        tasks.append(asyncio.create_task(m.run()))
    return tasks


async def _stop(tasks: list[asyncio.Task[None]]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _split(data: bytes) -> list[bytes]:
    """Whole frames (length prefix included) of a recorded byte stream."""
    out = []
    while len(data) >= 4:
        (n,) = struct.unpack(">I", data[:4])
        if len(data) < 4 + n:
            break
        out.append(data[: 4 + n])
        data = data[4 + n :]
    return out


class Recorder:
    """A TCP proxy that forwards both ways and keeps every byte it saw, per direction."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = free_port()
        self.up = bytearray()  # dialer -> acceptor
        self.down = bytearray()  # acceptor -> dialer
        self.server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        tr, tw = await asyncio.open_connection("127.0.0.1", self.target)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, log: bytearray) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    log += data
                    dst.write(data)
                    await dst.drain()
            dst.close()

        tasks = [asyncio.create_task(pipe(r, tw, self.up)), asyncio.create_task(pipe(tr, w, self.down))]
        self._pipes.update(tasks)
        await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for t in self._pipes:
            t.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)


async def _handshake(port: int, node: str, secret: bytes = SECRET) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Dial ``port`` and prove the secret as a replica with node id ``node`` would."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    challenge = await asyncio.wait_for(frames.read_frame(reader, secret), 5)
    assert challenge is not None and challenge.kind == frames.CHALLENGE, challenge
    mine = secrets.token_hex(16)
    body = {
        "role": "dial",
        "node": node,
        "peer": challenge.body["node"],
        "challenge": challenge.body["nonce"],
        "nonce": mine,
        "pid": 0,
    }
    writer.write(frames.encode(frames.HELLO, body, secret))
    reply = await asyncio.wait_for(frames.read_frame(reader, secret), 5)
    assert reply is not None and reply.kind == frames.HELLO and reply.body["challenge"] == mine, reply
    return reader, writer


async def _closed_on_us(reader: asyncio.StreamReader, within: float = 5.0) -> bytes | None:
    """Everything the other side sent until it closed the connection; None: it kept it open."""
    try:
        return await asyncio.wait_for(reader.read(), within)
    except TimeoutError:
        return None


async def test_a_captured_hello_replayed_takes_no_place_and_the_real_peer_still_joins() -> None:
    """A recording proxy between two real meshes captures the whole handshake. Replayed 200 times
    against the acceptor (the dialer's HELLO, and the acceptor's own answer reflected back), not one
    replay is answered with a HELLO or takes an authenticated place; a peer dialling afterwards (the
    restarted replica) joins and its wake arrives well under a second after it is published."""
    pa = free_port()
    good, heard = _mesh(pa, max_inbound=64)
    tasks = await _running(good)
    proxy = Recorder(pa)
    await proxy.start()
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        victim, _ = _mesh(free_port(), [proxy.port])
        first = await _running(victim)
        await eventually(lambda: victim.connected == 1, "the captured peer connected through the proxy")
        await eventually(lambda: len(good._authed) == 1, "the acceptor counts it")
        await _stop(first)  # the captured replica goes away (a restart gives it a new node id)
        await eventually(lambda: len(good._authed) == 0, "its place freed")
        captured = [f for f in _split(bytes(proxy.up)) + _split(bytes(proxy.down))]
        hellos = [f for f in captured if f[5] == frames.HELLO]
        assert len(hellos) == 2  # the dialer's HELLO and the acceptor's answer

        replays = 200
        for i in range(replays):
            conns.append(await asyncio.open_connection("127.0.0.1", pa))
            conns[-1][1].write(hellos[i % 2])
        answers = await asyncio.gather(*(_closed_on_us(r) for r, _ in conns))
        held = sum(1 for a in answers if a is None)
        assert held == 0, f"{held} of {replays} replays hold a connection ({len(good._authed)} authenticated)"
        for answer in answers:  # each replay closed on it, and never given a HELLO
            assert answer is not None and all(f[5] != frames.HELLO for f in _split(answer)), answer
        assert len(good._authed) == 0
        refused = good.dropped.get("recv:replayed", 0) + good.dropped.get("recv:pending_evicted", 0)
        assert refused == replays and good.dropped.get("recv:replayed", 0) >= 1, good.dropped

        back, _ = _mesh(free_port(), [pa])  # the restarted replica
        tasks += await _running(back)
        await eventually(lambda: back.connected == 1, "the restarted peer joined")
        t0 = time.perf_counter()
        back.publish_wake("t", "q")
        await asyncio.wait_for(heard.wait(), 5)
        latency = time.perf_counter() - t0
        assert latency < 0.25, latency
    finally:
        for _, w in conns:
            w.close()
        await proxy.close()
        await _stop(tasks)
