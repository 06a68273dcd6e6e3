"""The mesh of one broker process: listeners, peers, the coalesced fan-out and the fan-in.

Fan-out: :meth:`Mesh.publish_wake` (a sink of :class:`~queen_pg.engine.waiters.Waiters`) collects
(tenant, queue) keys; the flusher sends them as one WAKE frame to every peer, then waits
``coalesce_s`` before the next frame, so a queue costs at most one frame per ``coalesce_s`` however
many pushes it gets, and the first wake after a quiet spell leaves at once. Maintenance flips and
queue-config changes ride the same flush.

Fan-in: a frame from a peer wakes this process's pops (``on_wake``), asks for a maintenance re-read
(``on_maintenance``) or drops cached queue config (``on_config``). With ``queen-pg serve --workers N``
the workers of one host find each other through Unix sockets in ``local_dir`` (``<pid>.sock``), and
share the TCP port (SO_REUSEPORT): a remote peer's connection lands on one worker, which relays the
frame (flag RELAYED, never relayed twice) to its siblings.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from queen_pg.engine.waiters import Waiters
from queen_pg.mesh import frames
from queen_pg.mesh.peers import Connect, Peer

if TYPE_CHECKING:
    from queen_pg.settings import Settings

log = logging.getLogger("queen_pg.mesh")

HELLO_TIMEOUT_S = 5.0
SCAN_INTERVAL_S = 1.0
BODY_BUDGET = 48 * 1024  # bytes of keys per WAKE/CONFIG frame (a frame's body may hold 64 KiB)


@dataclass(frozen=True, slots=True)
class MeshConfig:
    secret: bytes = b""
    bind: str = "127.0.0.1"
    port: int | None = None  # None: no TCP listener (workers-only mesh)
    peers: tuple[tuple[str, int], ...] = ()
    local_dir: Path | None = None  # the workers of one host (queen-pg serve --workers N)
    outbox: int = 1024  # frames queued per peer before new ones are dropped
    coalesce_s: float = 0.002
    # inbound connections held at once (each peer and sibling dials one); beyond it a new one is
    # closed at once and counted, so a flood of half-open dials cannot take the process's descriptors
    max_inbound: int = 64
    node: str = field(default_factory=lambda: uuid.uuid4().hex)


def parse_peers(text: str) -> tuple[tuple[str, int], ...]:
    """``host:port,host:port`` (IPv6 as ``[::1]:7000``); ValueError naming the bad entry."""
    out: list[tuple[str, int]] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"mesh peer {item!r} is not host:port")
        out.append((host, int(port)))
    return tuple(out)


def _nothing(*_: object) -> None:
    return None


class Mesh:
    def __init__(
        self,
        config: MeshConfig,
        on_wake: Callable[[str, str], None],
        on_maintenance: Callable[[], None] = _nothing,
        on_config: Callable[[str, str], None] = _nothing,
    ) -> None:
        self.config = config
        self.node = config.node
        self.secret = config.secret
        self.on_wake = on_wake
        self.on_maintenance = on_maintenance
        self.on_config = on_config
        self.peers: dict[str, Peer] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._servers: list[asyncio.Server] = []
        self._wakes: set[tuple[str, str]] = set()
        self._configs: set[tuple[str, str]] = set()
        self._maintenance = False
        self._kick = asyncio.Event()
        self._sock_path: Path | None = None
        self._conns: set[asyncio.Task[Any]] = set()  # inbound connection handlers
        # counters read by queen_pg/metrics.py
        self.frames_sent = 0
        self.frames_received = 0
        self.frames_relayed = 0
        self.dropped: dict[str, int] = {}  # "send:<reason>" / "recv:<reason>" -> count

    # ---- bookkeeping ----------------------------------------------------------------------------
    def hello(self) -> bytes:
        return frames.encode(frames.HELLO, {"node": self.node, "pid": os.getpid()}, self.secret)

    def dropped_send(self, reason: str, n: int = 1) -> None:
        self.dropped[f"send:{reason}"] = self.dropped.get(f"send:{reason}", 0) + n

    def dropped_recv(self, reason: str) -> None:
        self.dropped[f"recv:{reason}"] = self.dropped.get(f"recv:{reason}", 0) + 1

    def sent(self, n: int) -> None:
        self.frames_sent += n

    @property
    def connected(self) -> int:
        return sum(1 for p in self.peers.values() if p.connected)

    @property
    def outbox_depth(self) -> int:
        return sum(p.outbox.qsize() for p in self.peers.values())

    # ---- publishing -------------------------------------------------------------------------------
    def publish_wake(self, tenant: str, queue: str) -> None:
        self._wakes.add((tenant, queue))
        self._kick.set()

    def publish_config(self, tenant: str, queue: str) -> None:
        self._configs.add((tenant, queue))
        self._kick.set()

    def publish_maintenance(self) -> None:
        self._maintenance = True
        self._kick.set()

    def _frames(self) -> list[bytes]:
        out: list[bytes] = []
        for kind, keys in ((frames.WAKE, self._wakes), (frames.CONFIG, self._configs)):
            chunk: list[list[str]] = []
            size = 0
            for t, q in keys:
                chunk.append([t, q])
                size += len(t) + len(q) + 8
                if size >= BODY_BUDGET:
                    out.append(frames.encode(kind, chunk, self.secret))
                    chunk, size = [], 0
            if chunk:
                out.append(frames.encode(kind, chunk, self.secret))
        if self._maintenance:
            out.append(frames.encode(frames.MAINTENANCE, {}, self.secret))
        self._wakes, self._configs, self._maintenance = set(), set(), False
        return out

    async def _flusher(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            out = self._frames()
            for peer in list(self.peers.values()):
                if peer.is_self:
                    continue
                for f in out:
                    peer.offer(f)
            await asyncio.sleep(self.config.coalesce_s)

    # ---- receiving ----------------------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, local: bool) -> None:
        if len(self._conns) >= self.config.max_inbound:
            self.dropped_recv("too_many_connections")
            if self.dropped["recv:too_many_connections"] == 1:  # once: a flood must not flood the log too
                log.warning("event=mesh_inbound_refused max_inbound=%d", self.config.max_inbound)
            writer.close()
            return
        me = asyncio.current_task()
        if me is not None:
            self._conns.add(me)
        try:
            try:
                hello = await asyncio.wait_for(frames.read_frame(reader, self.secret), HELLO_TIMEOUT_S)
            except frames.FrameError as exc:
                self.dropped_recv(exc.reason)
                return
            except (TimeoutError, OSError, asyncio.IncompleteReadError):
                self.dropped_recv("no_hello")
                return
            if hello is None or hello.kind != frames.HELLO or not isinstance(hello.body, dict):
                self.dropped_recv("no_hello")
                return
            writer.write(self.hello())
            await writer.drain()
            if hello.body.get("node") == self.node:
                return  # we dialled ourselves; the dialler learns it from our HELLO
            while True:
                try:
                    frame = await frames.read_frame(reader, self.secret)
                except frames.FrameError as exc:
                    self.dropped_recv(exc.reason)
                    if exc.fatal:
                        log.warning("event=mesh_frame_refused reason=%s local=%s", exc.reason, local)
                        return
                    continue
                if frame is None:
                    return
                self.frames_received += 1
                self._dispatch(frame, local)
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return  # a cancel (close()) ends the handler quietly: asyncio's stream callback logs otherwise
        finally:
            self._conns.discard(me)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _dispatch(self, frame: frames.Frame, local: bool) -> None:
        body = frame.body
        if frame.kind in (frames.WAKE, frames.CONFIG):
            if not isinstance(body, list) or not all(
                isinstance(k, list) and len(k) == 2 and all(isinstance(x, str) for x in k) for k in body
            ):
                self.dropped_recv("malformed")
                return
            handler = self.on_wake if frame.kind == frames.WAKE else self.on_config
            for t, q in body:
                handler(t, q)
        elif frame.kind == frames.MAINTENANCE:
            self.on_maintenance()
        else:
            return
        if not local and not frame.flags & frames.RELAYED:
            siblings = [p for p in self.peers.values() if p.local]
            if siblings:
                relayed = frames.encode(frame.kind, body, self.secret, flags=frames.RELAYED)
                for p in siblings:
                    p.offer(relayed)
                self.frames_relayed += 1

    # ---- lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind the listeners (a port in use fails the boot); :meth:`run` dials the peers."""
        cfg = self.config
        if cfg.port is not None:
            self._servers.append(
                await asyncio.start_server(
                    lambda r, w: self._accept(r, w, False),
                    cfg.bind,
                    cfg.port,
                    reuse_port=cfg.local_dir is not None,  # the workers of one host share the port
                )
            )
        if cfg.local_dir is not None:
            path = cfg.local_dir / f"{os.getpid()}.sock"
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            self._servers.append(await asyncio.start_unix_server(lambda r, w: self._accept(r, w, True), str(path)))
            self._sock_path = path

    @property
    def port(self) -> int | None:
        """The TCP port actually bound (the configured one, or the one the OS chose for port 0)."""
        for s in self._servers:
            for sock in s.sockets:
                if sock.family in (socket.AF_INET, socket.AF_INET6):
                    return int(sock.getsockname()[1])
        return None

    def _spawn(self, name: str, coro: Any) -> None:
        self._tasks[name] = asyncio.create_task(coro, name=f"queen:mesh:{name}")

    def _add_peer(self, name: str, connect: Connect, local: bool) -> None:
        peer = Peer(self, name, connect, local, self.config.outbox)
        self.peers[name] = peer
        self._spawn(f"peer:{name}", peer.run())

    def _drop_peer(self, name: str) -> None:
        self.peers.pop(name, None)
        task = self._tasks.pop(f"peer:{name}", None)
        if task is not None:
            task.cancel()

    def _scan(self) -> None:
        """Find the sibling workers' sockets; forget the ones that went away."""
        assert self.config.local_dir is not None
        seen: set[str] = set()
        for path in self.config.local_dir.glob("*.sock"):
            if path == self._sock_path:
                continue
            pid = path.stem
            if pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(OSError):
                    path.unlink()  # a worker that died without cleaning up
                continue
            name = f"unix:{path.name}"
            seen.add(name)
            if name not in self.peers:
                self._add_peer(name, _unix_dialer(str(path)), local=True)
        for name in [n for n, p in self.peers.items() if p.local and n not in seen]:
            self._drop_peer(name)

    async def _scanner(self) -> None:
        while True:
            await asyncio.sleep(SCAN_INTERVAL_S)
            self._scan()

    async def run(self) -> None:
        """The supervised task: dials the peers, runs the flusher (and the sibling scanner), and on
        cancel stops them all and closes the listeners."""
        cfg = self.config
        try:
            for host, port in cfg.peers:
                self._add_peer(f"{host}:{port}", _dialer(host, port), local=False)
            self._spawn("flusher", self._flusher())
            if cfg.local_dir is not None:
                self._scan()
                self._spawn("scanner", self._scanner())
            await asyncio.Event().wait()
        finally:
            await self.close()

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        for task in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        for s in self._servers:
            s.close()
        self._servers.clear()
        conns = list(self._conns)
        for t in conns:
            t.cancel()
        await asyncio.gather(*conns, return_exceptions=True)
        if self._sock_path is not None:
            with contextlib.suppress(OSError):
                self._sock_path.unlink()


def from_settings(settings: Settings, waiters: Waiters, on_maintenance: Callable[[], None]) -> Mesh | None:
    """The mesh this process's settings ask for (None: no port and no sibling workers): peers'
    wakes and config changes wake this process's pops; the mesh hears every local notify."""
    if settings.mesh_port is None and settings.mesh_local_dir is None:
        return None
    config = MeshConfig(
        secret=settings.mesh_secret.encode(),
        bind=settings.mesh_bind,
        port=settings.mesh_port,
        peers=parse_peers(settings.mesh_peers),
        local_dir=settings.mesh_local_dir,
        outbox=settings.mesh_outbox,
    )
    mesh = Mesh(config, on_wake=waiters.wake, on_maintenance=on_maintenance, on_config=waiters.wake)
    waiters.add_sink(mesh.publish_wake)
    return mesh


def _dialer(host: str, port: int) -> Connect:
    return lambda: asyncio.open_connection(host, port)


def _unix_dialer(path: str) -> Connect:
    return lambda: asyncio.open_unix_connection(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
