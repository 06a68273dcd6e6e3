"""One outbound connection to a peer: a bounded outbox, a writer, reconnect with jittered backoff.

A replica only *sends* on the connections it dials and only *reads* on the ones it accepts
(``queen_pg/mesh/node.py``), so each pair of replicas has two one-way TCP connections and no
connection needs to be deduplicated. The dialer sends HELLO and waits for the acceptor's HELLO: that
proves the acceptor holds the secret, and tells the dialer when it dialled itself (a peer list that
names every replica, this one included, is fine). :meth:`Peer.offer` never waits: a frame for a
peer that is down or whose outbox is full is dropped and counted (a wake is a hint). A frame offered
while the connection is idle (nothing queued, nothing in the socket's buffer) is written at once, in
the offering call: the outbox and its writer task are for a peer that has not taken our bytes yet
(that hop, with its ``wait``/``wait_for`` tasks, was most of the sending worker's cost of a wake).
Right after the HELLOs, before any other frame, the dialler writes the owner's ``greeting`` (to a
sibling worker: every key its pops wait on, so the acceptor may filter its wakes from then on).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Protocol

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


class Owner(Protocol):
    node: str
    secret: bytes

    def hello(self) -> bytes: ...
    def greeting(self, peer: Peer) -> list[bytes]: ...
    def dropped_send(self, reason: str, n: int = 1) -> None: ...
    def sent(self, n: int) -> None: ...


class Peer:
    def __init__(self, owner: Owner, name: str, connect: Connect, local: bool, limit: int) -> None:
        self.owner = owner
        self.name = name
        self.connect = connect
        self.local = local  # a worker of this host (Unix socket), not a replica
        self.outbox: asyncio.Queue[bytes] = asyncio.Queue(maxsize=limit)
        self.connected = False
        self.is_self = False
        self.node: str | None = None  # the peer's node id (its HELLO), once connected
        self.resync = False  # an INTEREST frame to this sibling was dropped: send a full one next
        self.rng = random.Random()
        self._writer: asyncio.StreamWriter | None = None  # while connected (set by _pump)
        self._get: asyncio.Future[bytes] | None = None  # the pump's wait for the outbox

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
            try:
                reader, w = await asyncio.wait_for(self.connect(), CONNECT_TIMEOUT_S)
                writer = w
                w.write(self.owner.hello())
                reply = await asyncio.wait_for(frames.read_frame(reader, self.owner.secret), CONNECT_TIMEOUT_S)
                if reply is None or reply.kind != frames.HELLO or not isinstance(reply.body, dict):
                    raise ConnectionError("no HELLO from the peer")
                if reply.body.get("node") == self.owner.node:
                    self.is_self = True
                    log.info("event=mesh_peer_is_self peer=%s", self.name)
                    return
                self.node = str(reply.body.get("node"))
                self.resync = False
                greeting = self.owner.greeting(self)  # a sibling: our interest, before any other frame
                for f in greeting:
                    w.write(f)
                self.owner.sent(len(greeting))
                self.connected = True
                delay = BACKOFF_MIN_S
                was_down_logged = False
                log.info("event=mesh_peer_up peer=%s node=%s", self.name, reply.body.get("node"))
                await self._pump(reader, w)
            except (OSError, TimeoutError, ConnectionError, frames.FrameError, asyncio.IncompleteReadError) as exc:
                if self.connected or not was_down_logged:
                    log.warning("event=mesh_peer_down peer=%s error=%s: %s", self.name, exc.__class__.__name__, exc)
                    was_down_logged = True
            finally:
                self.connected = False
                dropped = self.outbox.qsize()
                while not self.outbox.empty():
                    self.outbox.get_nowait()
                if dropped:
                    self.owner.dropped_send("peer_down", dropped)
                if writer is not None:
                    writer.close()
                    with contextlib.suppress(Exception):
                        await writer.wait_closed()
            await asyncio.sleep(delay * self.rng.uniform(0.5, 1.5))
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        eof = asyncio.ensure_future(reader.read(1))  # the acceptor sends nothing after HELLO: EOF = gone
        get: asyncio.Future[bytes] | None = None
        self._writer = writer
        try:
            while True:
                get = self._get = asyncio.ensure_future(self.outbox.get())
                done, _ = await asyncio.wait({get, eof}, return_when=asyncio.FIRST_COMPLETED)
                if eof in done:
                    raise ConnectionError("peer closed the connection")
                n = 1
                writer.write(get.result())
                while not self.outbox.empty():  # whatever queued meanwhile goes in the same write
                    writer.write(self.outbox.get_nowait())
                    n += 1
                await asyncio.wait_for(writer.drain(), DRAIN_TIMEOUT_S)
                self.owner.sent(n)
        finally:
            self._writer = self._get = None
            for fut in (get, eof):
                if fut is not None and not fut.done():
                    fut.cancel()
