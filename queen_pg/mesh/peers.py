"""One outbound connection to a peer: a bounded outbox, a writer, reconnect with jittered backoff.

A replica only *sends* on the connections it dials and only *reads* on the ones it accepts
(``queen_pg/mesh/node.py``), so each pair of replicas has two one-way TCP connections. The handshake
(``queen_pg/mesh/frames.py``): the acceptor sends a CHALLENGE (its node id and a fresh nonce), the
dialer answers with a HELLO that signs that nonce, both node ids, the role "dial" and a nonce of its
own, and waits for the acceptor's HELLO, which must sign the dialer's nonce: that proves the acceptor
holds the secret *now* (a recorded answer signs an old nonce), and tells the dialer when it dialled
itself (a peer list that names every replica, this one included, is fine). The CHALLENGE names the
acceptor: when another address of our list is connected to that very node, this one does not answer
and stands down (logged) until that connection ends (the acceptor keeps one connection per node id,
the newer, so two addresses of one replica would otherwise push each other out for ever).
:meth:`Peer.offer` never waits: a frame for a
peer that is down or whose outbox is full is dropped and counted (a wake is a hint). A frame offered
while the connection is idle (nothing queued, nothing in the socket's buffer) is written at once, in
the offering call: the outbox and its writer task are for a peer that has not taken our bytes yet
(that hop, with its ``wait``/``wait_for`` tasks, was most of the sending worker's cost of a wake).
Right after the HELLOs, before any other frame, the dialler writes the owner's ``greeting`` (to a
sibling worker: every key its pops wait on, so the acceptor may filter its wakes from then on). A
connection that has carried nothing for a third of the acceptor's idle timeout (it says which in its
HELLO) gets a PING, so the acceptor, which drops authenticated connections silent for that long, keeps
a live idle peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from queen_pg.mesh import frames

log = logging.getLogger("queen_pg.mesh")

Connect = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


def tcp_dialer(host: str, port: int) -> Connect:
    return lambda: asyncio.open_connection(host, port)


def unix_dialer(path: str) -> Connect:
    return lambda: asyncio.open_unix_connection(path)


CONNECT_TIMEOUT_S = 5.0
DRAIN_TIMEOUT_S = 5.0  # a peer that takes longer to take our bytes is treated as gone
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 5.0
PING_MIN_S = 0.01  # however small the acceptor's idle timeout
# what a dialer that got no CHALLENGE logs: the likely cause during a rolling upgrade
NO_CHALLENGE = "a replica older than mesh frame version 2 sends none: it waits for a HELLO; upgrade it"


class Owner(Protocol):
    node: str
    secret: bytes
    peers: dict[str, Peer]

    def hello(self, role: str, peer: str, challenge: str, **more: Any) -> bytes: ...
    def greeting(self, peer: Peer) -> list[bytes]: ...
    def dropped_send(self, reason: str, n: int = 1) -> None: ...
    def sent(self, n: int) -> None: ...


class _Twin(Exception):
    """The acceptor is a node another of our peers is connected to."""

    def __init__(self, peer: Peer) -> None:
        super().__init__(peer.name)
        self.peer = peer


class Peer:
    def __init__(self, owner: Owner, name: str, connect: Connect, local: bool, limit: int) -> None:
        self.owner = owner
        self.name = name
        self.connect = connect
        self.local = local  # a worker of this host (Unix socket), not a replica
        self.outbox: asyncio.Queue[bytes] = asyncio.Queue(maxsize=limit)
        self.connected = False
        self.is_self = False
        self.twin: str | None = None  # while this one stands down: our peer connected to the same node
        self.down = asyncio.Event()  # set while not connected (a twin standing down waits for it)
        self.down.set()
        self.node: str | None = None  # the peer's node id (its HELLO), once connected
        self.resync = False  # an INTEREST frame to this sibling was dropped: send a full one next
        self.rng = random.Random()
        self._writer: asyncio.StreamWriter | None = None  # while connected (set by _pump)
        self._get: asyncio.Future[bytes] | None = None  # the pump's wait for the outbox
        self._last_write = 0.0  # time.monotonic() of our last write on the connection (PING when idle)

    def offer(self, frame: bytes) -> bool:
        """Write or queue ``frame``; False when it was dropped (peer down, outbox full)."""
        if not self.connected:
            self.owner.dropped_send("peer_down")
            return False
        w = self._writer
        if (
            w is not None
            and self.outbox.empty()
            and (self._get is None or not self._get.done())  # the pump holds no frame it has yet to write
            and not w.transport.is_closing()
            and w.transport.get_write_buffer_size() == 0  # the peer took all our bytes so far
        ):
            w.write(frame)
            self._last_write = time.monotonic()
            self.owner.sent(1)
            return True
        try:
            self.outbox.put_nowait(frame)
        except asyncio.QueueFull:
            self.owner.dropped_send("queue_full")
            return False
        return True

    async def run(self) -> None:
        """Keep a connection up until cancelled (or until the peer turns out to be this process)."""
        delay = BACKOFF_MIN_S
        was_down_logged = False
        while True:
            writer: asyncio.StreamWriter | None = None
            twin: Peer | None = None
            try:
                reader, w = await asyncio.wait_for(self.connect(), CONNECT_TIMEOUT_S)
                writer = w
                node, ping_s = await self._handshake(reader, w)
                if node == self.owner.node:
                    self.is_self = True
                    log.info("event=mesh_peer_is_self peer=%s", self.name)
                    return
                self.node = node
                self.resync = False
                greeting = self.owner.greeting(self)  # a sibling: our interest, before any other frame
                for f in greeting:
                    w.write(f)
                self.owner.sent(len(greeting))
                self.connected = True
                self.down.clear()
                delay = BACKOFF_MIN_S
                was_down_logged = False
                log.info("event=mesh_peer_up peer=%s node=%s", self.name, node)
                await self._pump(reader, w, ping_s)
            except _Twin as exc:
                twin = exc.peer
            except (OSError, TimeoutError, ConnectionError, frames.FrameError, asyncio.IncompleteReadError) as exc:
                if self.connected or not was_down_logged:
                    log.warning("event=mesh_peer_down peer=%s error=%s: %s", self.name, exc.__class__.__name__, exc)
                    was_down_logged = True
            finally:
                self.connected = False
                self.down.set()
                dropped = self.outbox.qsize()
                while not self.outbox.empty():
                    self.outbox.get_nowait()
                if dropped:
                    self.owner.dropped_send("peer_down", dropped)
                if writer is not None:
                    writer.close()
                    with contextlib.suppress(Exception):
                        await writer.wait_closed()
            if twin is not None:  # stand down while our other address holds the node's one place
                self.twin = twin.name
                log.warning("event=mesh_peer_duplicate peer=%s same_as=%s node=%s", self.name, twin.name, twin.node)
                await twin.down.wait()
                self.twin = None
                delay = BACKOFF_MIN_S
            await asyncio.sleep(delay * self.rng.uniform(0.5, 1.5))
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[str, float]:
        """Answer the acceptor's CHALLENGE and check that its HELLO answers ours: (its node id, the
        PING interval it asks for)."""
        secret = self.owner.secret
        try:
            challenge = await asyncio.wait_for(frames.read_frame(reader, secret), CONNECT_TIMEOUT_S)
        except TimeoutError:
            raise ConnectionError(f"no CHALLENGE within {CONNECT_TIMEOUT_S:g} s ({NO_CHALLENGE})") from None
        if challenge is None:
            raise ConnectionError(f"closed before its CHALLENGE (a flood of dials evicted ours, or {NO_CHALLENGE})")
        body = challenge.body
        if (
            challenge.kind != frames.CHALLENGE
            or not isinstance(body, dict)
            or not isinstance(body.get("node"), str)
            or not isinstance(body.get("nonce"), str)
        ):
            raise ConnectionError("the peer's first frame is no CHALLENGE")
        node: str = body["node"]
        twin = self._twin(node)
        if twin is not None:
            raise _Twin(twin)
        mine = secrets.token_hex(16)
        writer.write(self.owner.hello("dial", node, body["nonce"], nonce=mine))
        reply = await asyncio.wait_for(frames.read_frame(reader, secret), CONNECT_TIMEOUT_S)
        if reply is None:
            raise ConnectionError("closed after our HELLO (refused: see the peer's queen_mesh_frames_dropped_total)")
        got = reply.body
        if (
            reply.kind != frames.HELLO
            or not isinstance(got, dict)
            or got.get("role") != "accept"
            or not frames.same(got.get("challenge"), mine)
            or not frames.same(got.get("peer"), self.owner.node)
            or not frames.same(got.get("node"), node)
        ):
            raise ConnectionError("the peer's HELLO does not answer our challenge")
        idle = got.get("idle")
        ping_s = idle / 3 if isinstance(idle, int | float) and idle > 0 else BACKOFF_MAX_S
        return node, max(ping_s, PING_MIN_S)

    def _twin(self, node: str) -> Peer | None:
        """Another of our peers of the same kind, connected to ``node`` (the list names it twice)."""
        for p in self.owner.peers.values():
            if p is not self and p.local == self.local and p.connected and p.node == node:
                return p
        return None

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ping_s: float) -> None:
        eof = asyncio.ensure_future(reader.read(1))  # the acceptor sends nothing after HELLO: EOF = gone
        get: asyncio.Future[bytes] | None = None
        self._writer = writer
        self._last_write = time.monotonic()
        try:
            while True:
                get = self._get = asyncio.ensure_future(self.outbox.get())
                while True:
                    quiet = time.monotonic() - self._last_write
                    if quiet >= ping_s:  # nothing written for a while: tell the acceptor we are alive
                        writer.write(frames.encode(frames.PING, 0, self.owner.secret))
                        self._last_write = time.monotonic()
                        await asyncio.wait_for(writer.drain(), DRAIN_TIMEOUT_S)
                        continue
                    done, _ = await asyncio.wait(
                        {get, eof}, timeout=ping_s - quiet, return_when=asyncio.FIRST_COMPLETED
                    )
                    if done:
                        break
                if eof in done:
                    raise ConnectionError("peer closed the connection")
                n = 1
                writer.write(get.result())
                while not self.outbox.empty():  # whatever queued meanwhile goes in the same write
                    writer.write(self.outbox.get_nowait())
                    n += 1
                self._last_write = time.monotonic()
                await asyncio.wait_for(writer.drain(), DRAIN_TIMEOUT_S)
                self.owner.sent(n)
        finally:
            self._writer = self._get = None
            for fut in (get, eof):
                if fut is not None and not fut.done():
                    fut.cancel()
