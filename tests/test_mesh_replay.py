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
import hashlib
import hmac
import logging
import secrets
import struct
import time
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from queen_pg.mesh import frames
from queen_pg.mesh.node import Mesh, MeshConfig
from tests.conftest import free_port
from tests.helpers import eventually

SECRET = b"s3cret"


def _mesh(port: int, peers: Sequence[int] = (), **more: Any) -> tuple[Mesh, asyncio.Event]:
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


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _dial(port: int, node: str) -> tuple[Conn, frames.Frame | None]:
    """Dial ``port`` and answer its CHALLENGE as a replica with node id ``node`` (and the secret) would:
    the connection and the acceptor's answer (None: it closed on us instead)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    challenge = await asyncio.wait_for(frames.read_frame(reader, SECRET), 5)
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
    writer.write(frames.encode(frames.HELLO, body, SECRET))
    reply = await asyncio.wait_for(frames.read_frame(reader, SECRET), 5)
    if reply is not None:
        assert reply.kind == frames.HELLO and reply.body["challenge"] == mine and reply.body["role"] == "accept"
    return (reader, writer), reply


async def _handshake(port: int, node: str) -> Conn:
    """An authenticated connection to ``port`` as node ``node``."""
    conn, reply = await _dial(port, node)
    assert reply is not None, "the acceptor closed on a valid HELLO"
    return conn


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
    conns: list[Conn] = []
    try:
        victim, _ = _mesh(free_port(), [proxy.port])
        first = await _running(victim)
        await eventually(lambda: victim.connected == 1, "the captured peer connected through the proxy")
        await eventually(lambda: len(good._authed) == 1, "the acceptor counts it")
        await _stop(first)  # the captured replica goes away (a restart gives it a new node id)
        await eventually(lambda: len(good._authed) == 0, "its place freed")
        captured = _split(bytes(proxy.up)) + _split(bytes(proxy.down))
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


async def test_a_newer_connection_from_a_node_replaces_the_older_even_at_the_cap() -> None:
    """max_inbound = 1 and a node holds it: the same node dialling again takes its own place (the older
    connection is closed: a peer whose end went away unseen rejoins at once), another node is still
    refused, and a wake on the newer connection is heard."""
    pa = free_port()
    good, heard = _mesh(pa, max_inbound=1)
    tasks = await _running(good)
    conns: list[Conn] = []
    try:
        conns.append(await _handshake(pa, "node-n"))
        conns.append(await _handshake(pa, "node-n"))
        assert await _closed_on_us(conns[0][0]) == b"", "the older connection of node-n is still held"
        assert len(good._authed) == 1 and good.dropped == {"recv:replaced": 1}
        other, reply = await _dial(pa, "node-m")  # a different node: the cap holds
        conns.append(other)
        assert reply is None and good.dropped["recv:too_many_connections"] == 1
        conns[1][1].write(frames.encode(frames.WAKE, [["t", "q"]], SECRET))
        await asyncio.wait_for(heard.wait(), 5)
        assert len(good._authed) == 1
    finally:
        for _, w in conns:
            w.close()
        await _stop(tasks)


async def test_a_silent_authenticated_connection_is_dropped_and_a_live_idle_peer_is_kept() -> None:
    """Idle timeout 0.5 s. A real peer that has nothing to say keeps its connection (it PINGs); a
    connection that proved the secret and then says nothing is closed after the timeout, counted and
    logged, and its place is free again."""
    pa = free_port()
    good, heard = _mesh(pa, idle_timeout_s=0.5)
    tasks = await _running(good)
    conns: list[Conn] = []
    try:
        live, _ = _mesh(free_port(), [pa])
        tasks += await _running(live)
        await eventually(lambda: live.connected == 1, "the live peer connected")
        kept = good._inbound[(False, live.node)]
        conns.append(await _handshake(pa, "silent"))
        t0 = time.perf_counter()
        assert await _closed_on_us(conns[0][0]) == b"", "the silent authenticated connection is still held"
        waited = time.perf_counter() - t0
        assert 0.4 <= waited < 2.0, waited
        assert good.dropped == {"recv:idle": 1} and len(good._authed) == 1
        # the live peer, idle at least as long, still holds the connection it started with
        assert good._inbound[(False, live.node)] is kept and not kept.task.done() and live.connected == 1
        assert good.frames_received == 0  # its PINGs are not counted as frames
        live.publish_wake("t", "q")
        await asyncio.wait_for(heard.wait(), 5)
    finally:
        for _, w in conns:
            w.close()
        await _stop(tasks)


async def test_a_replica_listed_under_two_addresses_keeps_one_connection() -> None:
    """The dialer's list names the acceptor twice (directly and through a proxy): the acceptor keeps
    one connection per node, so the address that finds the node already connected stands down (logged)
    instead of the two pushing each other out for ever; wakes still cross, and when the connection
    that stood goes away, the other address takes over."""
    pa = free_port()
    good, heard = _mesh(pa)
    tasks = await _running(good)
    proxy = Recorder(pa)
    await proxy.start()
    try:
        dialer, _ = _mesh(free_port(), [pa, proxy.port])
        tasks += await _running(dialer)
        await eventually(lambda: any(p.twin for p in dialer.peers.values()), "one address stood down")
        (twin,) = [n for n, p in dialer.peers.items() if p.twin]
        (kept,) = [n for n in dialer.peers if n != twin]
        await eventually(lambda: dialer.connected == 1 and len(good._authed) == 1, "one connection")
        assert dialer.peers[kept].connected
        dialer.publish_wake("t", "q")
        await asyncio.wait_for(heard.wait(), 5)
        assert dialer.dropped == {}  # the address standing down is not offered frames
        dialer._drop_peer(kept)  # that connection goes: the other address takes its place
        await eventually(lambda: dialer.peers[twin].connected, "the other address connected")
        assert dialer.peers[twin].twin is None
    finally:
        await proxy.close()
        await _stop(tasks)


def _v1_hello(node: str) -> bytes:
    """The HELLO a replica of frame version 1 sends as soon as it connects (no challenge)."""
    signed = struct.pack(">BBBQ", 1, frames.HELLO, 0, int(time.time() * 1000)) + orjson.dumps({"node": node, "pid": 1})
    mac = hmac.new(SECRET, signed, hashlib.sha256).digest()
    return struct.pack(">I", len(signed) + len(mac)) + signed + mac


async def test_an_old_and_a_new_replica_refuse_each_other_with_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    """A rolling upgrade: a version-1 replica dialling us sends its HELLO at once; it is refused as
    "version" and logged (once per host), nothing crashes. Dialling a version-1 replica (which waits
    for our HELLO and hangs up, sending nothing), we log that it sent no CHALLENGE and why."""
    caplog.set_level(logging.INFO, logger="queen_pg.mesh")
    pa = free_port()
    good, _ = _mesh(pa)
    tasks = await _running(good)

    async def old_acceptor(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(TimeoutError, OSError):
            await asyncio.wait_for(r.read(1), 0.2)  # a version-1 acceptor waits for a HELLO first
        w.close()

    old_port = free_port()
    old = await asyncio.start_server(old_acceptor, "127.0.0.1", old_port)
    try:
        for _ in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", pa)
            writer.write(_v1_hello("old-node"))
            said = await _closed_on_us(reader)
            assert said is not None and frames.decode(said[4:], SECRET).kind == frames.CHALLENGE
            writer.close()
        assert good.dropped == {"recv:version": 2} and len(good._authed) == 0
        logged = [r.getMessage() for r in caplog.records if "event=mesh_peer_version" in r.getMessage()]
        assert len(logged) == 1 and "version 1, this replica 2" in logged[0], logged

        dialer, _ = _mesh(free_port(), [old_port])
        tasks += await _running(dialer)

        def told() -> list[str]:
            return [r.getMessage() for r in caplog.records if "event=mesh_peer_down" in r.getMessage()]

        await eventually(lambda: bool(told()), "the dialer's log line")
        assert "older than mesh frame version 2" in told()[0], told()
        assert dialer.connected == 0
    finally:
        old.close()
        await _stop(tasks)
