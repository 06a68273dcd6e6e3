"""The mesh of one broker process: listeners, peers, the coalesced fan-out and the fan-in.

Fan-out: :meth:`Mesh.publish_wake` (a sink of :class:`~queen_pg.engine.waiters.Waiters`) collects
(tenant, queue) keys; a flush scheduled with ``call_soon`` (no task, no timer) sends all the keys
published in that event-loop tick, de-duplicated, as one WAKE frame to each peer. Within
``coalesce_s`` of the last frames sent the flush waits for that window instead, so a queue costs at
most one frame per ``coalesce_s`` however many pushes it gets, and the first wake after a quiet spell
leaves at once. Maintenance flips and queue-config changes ride the same flush.

Interest between sibling workers (``local_dir``): each worker tells its siblings which keys its pops
wait on (INTEREST frames: the whole set first on each connection, then additions at once and removals
after ``INTEREST_LINGER_S`` without a waiter), and a worker sends a sibling only the WAKE keys it
listed; a sibling that has not said yet, and every remote replica, hears every wake. The race (a pop
starts waiting just as a push commits, so its INTEREST crosses the push's filtered wake) is closed by
time: an addition carries ``since`` (``time.monotonic()`` when the key gained its first waiter, before
the pop's first claim; the workers of one host share that clock), and the receiver answers it with a
WAKE when it published that key at or after ``since``. A push published before ``since`` committed
before the pop's claim began, so the claim sees it. The keys' push times are bounded
(``PUSHED_KEEP``); when the table is cleared, anything asked for from before the clearing is woken.

Fan-in: a frame from a peer wakes this process's pops (``on_wake``), asks for a maintenance re-read
(``on_maintenance``) or drops cached queue config (``on_config``). With ``queen-pg serve --workers N``
the workers of one host find each other through Unix sockets in ``local_dir`` (``<pid>.sock``), and
share the TCP port (SO_REUSEPORT): a remote peer's connection lands on one worker, which relays the
frame (flag RELAYED, never relayed twice) to its siblings.

Inbound connections: each gets a CHALLENGE (a fresh nonce) at once; until it answers with a HELLO
that signs that nonce it is pending, in a pool of its own (``max_pending``, ``HELLO_TIMEOUT_S`` each at
most) whose oldest is closed when a new one comes; only authenticated peers count against
``max_inbound``. So neither dials without the secret nor a recorded HELLO, replayed, can keep a peer
out. One node id holds one authenticated connection of each kind (TCP, Unix socket): a newer one
replaces the older, so a peer whose old connection we still hold (its end went away unseen) rejoins
at once. An authenticated connection that carries nothing for ``idle_timeout_s`` is closed (its
dialler PINGs a third of that apart when it has nothing to say), so a half-open one frees its place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from queen_pg.engine.waiters import Waiters
from queen_pg.mesh import frames
from queen_pg.mesh.peers import Connect, Peer, tcp_dialer, unix_dialer
from queen_pg.setting_values import parse_peers

if TYPE_CHECKING:
    from queen_pg.settings import Settings

log = logging.getLogger("queen_pg.mesh")

HELLO_TIMEOUT_S = 5.0
SCAN_INTERVAL_S = 1.0
INTEREST_LINGER_S = 5.0  # a key nobody waits on stays of interest this long (re-polling consumers)
PUSHED_KEEP = 65536  # keys whose last push time is kept for the INTEREST race (then: cleared, floor)


class InterestSource(Protocol):
    """What the mesh asks about this process's waiting pops (:class:`~queen_pg.engine.waiters.Waiters`)."""

    def interest(self) -> dict[tuple[str, str], float]: ...
    def expire_interest(self, now: float, linger: float) -> list[tuple[str, str]]: ...


@dataclass(frozen=True, slots=True)
class MeshConfig:
    secret: bytes = b""
    bind: str = "127.0.0.1"
    port: int | None = None  # None: no TCP listener (workers-only mesh)
    peers: tuple[tuple[str, int], ...] = ()
    local_dir: Path | None = None  # the workers of one host (queen-pg serve --workers N)
    outbox: int = 1024  # frames queued per peer before new ones are dropped
    coalesce_s: float = 0.002
    # authenticated inbound connections held at once (each peer and sibling dials one); beyond it a
    # peer is closed after its HELLO and counted
    max_inbound: int = 64
    # inbound connections that have not said HELLO yet, held apart from max_inbound: a new one closes
    # the oldest (counted), so silent dials can neither take a peer's place nor the descriptors
    max_pending: int = 16
    # an authenticated inbound connection that carries no frame for this long is closed; the dialler
    # (told in the acceptor's HELLO) PINGs a third of it apart when it has nothing to send
    idle_timeout_s: float = 30.0
    node: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass(slots=True)
class _Inbound:
    """An authenticated inbound connection: its handler task and when a frame last came."""

    task: asyncio.Task[Any]
    node: str
    local: bool
    last: float = field(default_factory=time.monotonic)
    timer: asyncio.TimerHandle | None = None
    closing: str = ""  # why we cancel it: "idle", "replaced"


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
        self._handle: asyncio.Handle | None = None  # the scheduled flush
        self._last_sent = -math.inf  # loop time of the last flush that sent frames
        # interest between sibling workers (set by from_settings when there are siblings)
        self.interest_source: InterestSource | None = None
        self._adds: dict[tuple[str, str], float] = {}  # ours, not sent yet
        self._drops: set[tuple[str, str]] = set()
        self._sibling_interest: dict[str, dict[tuple[str, str], float]] = {}  # node -> its keys (once told)
        self._interest_conn: dict[str, asyncio.Task[Any] | None] = {}  # node -> the connection that told us
        self._pushed: dict[tuple[str, str], float] = {}  # key -> monotonic time of our last wake of it
        self._pushed_floor = -math.inf
        self._sock_path: Path | None = None
        self._conns: set[asyncio.Task[Any]] = set()  # inbound connection handlers
        self._pending: dict[asyncio.Task[Any], None] = {}  # handlers waiting for a HELLO, oldest first
        self._authed: set[asyncio.Task[Any]] = set()  # handlers of peers that said a valid HELLO
        self._inbound: dict[tuple[bool, str], _Inbound] = {}  # (local, node id) -> its one connection
        self._version_logged: set[str] = set()  # hosts we logged an other-version frame from
        # counters read by queen_pg/metrics.py
        self.frames_sent = 0
        self.frames_received = 0
        self.frames_relayed = 0
        self.wakes_filtered = 0  # wake keys not sent to a sibling because none of its pops waited there
        self.wakes_caught_up = 0  # wakes sent in answer to a sibling's new interest (the race)
        self.dropped: dict[str, int] = {}  # "send:<reason>" / "recv:<reason>" -> count

    # ---- bookkeeping ----------------------------------------------------------------------------
    def hello(self, role: str, peer: str, challenge: str, **more: Any) -> bytes:
        """Our HELLO to node ``peer`` as ``role`` ("dial" or "accept"), signing its ``challenge``."""
        body = {"role": role, "node": self.node, "peer": peer, "challenge": challenge, "pid": os.getpid(), **more}
        return frames.encode(frames.HELLO, body, self.secret)

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
        key = (tenant, queue)
        self._wakes.add(key)
        if self.interest_source is not None:  # when, for a sibling whose pop starts waiting later
            if len(self._pushed) >= PUSHED_KEEP and key not in self._pushed:
                self._pushed.clear()
                self._pushed_floor = time.monotonic()  # anything older may have been pushed: wake it
            self._pushed[key] = time.monotonic()
        self._schedule()

    def publish_config(self, tenant: str, queue: str) -> None:
        self._configs.add((tenant, queue))
        self._schedule()

    def publish_maintenance(self) -> None:
        self._maintenance = True
        self._schedule()

    def publish_interest(self, tenant: str, queue: str, since: float) -> None:
        """A pop here waits on (tenant, queue) from ``since`` (``time.monotonic()``): tell the siblings."""
        key = (tenant, queue)
        self._adds[key] = since
        self._drops.discard(key)
        self._schedule()

    def _schedule(self) -> None:
        """Flush at the end of this event-loop tick (everything published in it goes in one frame per
        peer), or, within ``coalesce_s`` of the last frames sent, when that window closes."""
        if self._handle is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): the next publish in one flushes it all
            return
        delay = self._last_sent + self.config.coalesce_s - loop.time()
        self._handle = loop.call_soon(self._flush) if delay <= 0 else loop.call_later(delay, self._flush)

    def greeting(self, peer: Peer) -> list[bytes]:
        """The frames a newly connected peer gets first: a sibling, all the keys our pops wait on."""
        if not peer.local or self.interest_source is None:
            return []
        return frames.interest_frames(self.secret, self.interest_source.interest(), set(), full=True)

    def _flush(self) -> None:
        self._handle = None
        wakes, configs, maintenance = self._wakes, self._configs, self._maintenance
        adds, drops = self._adds, self._drops
        self._wakes, self._configs, self._maintenance, self._adds, self._drops = set(), set(), False, {}, set()
        shared = frames.key_frames(frames.CONFIG, self.secret, configs)
        if maintenance:
            shared.append(frames.encode(frames.MAINTENANCE, {}, self.secret))
        everyone: list[bytes] | None = None  # the WAKE frames of a peer that hears every wake
        sent = False
        for peer in list(self.peers.values()):
            if peer.is_self or peer.twin is not None:
                continue
            known = self._sibling_interest.get(peer.node) if peer.local and peer.node is not None else None
            if known is None:  # a replica, or a sibling that has not told us its interest yet: everything
                if everyone is None:
                    everyone = frames.key_frames(frames.WAKE, self.secret, wakes)
                out = everyone + shared
            else:
                mine = [k for k in wakes if k in known]
                self.wakes_filtered += len(wakes) - len(mine)
                out = frames.key_frames(frames.WAKE, self.secret, mine) + shared if mine else shared
            for f in out:
                peer.offer(f)
                sent = True
            if peer.local and self.interest_source is not None and (peer.resync or adds or drops):
                if peer.resync:
                    peer.resync = False
                    notes = frames.interest_frames(self.secret, self.interest_source.interest(), set(), full=True)
                else:
                    notes = frames.interest_frames(self.secret, adds, drops, full=False)
                for f in notes:
                    if not peer.offer(f) and peer.connected:
                        peer.resync = True  # the outbox was full: the whole state goes next time
        if sent:
            self._last_sent = asyncio.get_running_loop().time()

    def _sweep(self) -> None:
        """Tell the siblings about keys nobody here has waited on for ``INTEREST_LINGER_S``; retry a
        dropped INTEREST frame."""
        if self.interest_source is None:
            return
        gone = self.interest_source.expire_interest(time.monotonic(), INTEREST_LINGER_S)
        for key in gone:
            self._adds.pop(key, None)
            self._drops.add(key)
        if gone or any(p.resync for p in self.peers.values()):
            self._schedule()

    # ---- receiving ----------------------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, local: bool) -> None:
        me = asyncio.current_task()
        assert me is not None  # the server runs each handler as a task
        self._conns.add(me)
        if len(self._pending) >= self.config.max_pending:  # make room: the oldest silent dial goes
            oldest = next(iter(self._pending))
            del self._pending[oldest]
            oldest.cancel()
            self.dropped_recv("pending_evicted")
        self._pending[me] = None
        node: str | None = None
        conn: _Inbound | None = None
        try:
            nonce = secrets.token_hex(16)
            writer.write(frames.encode(frames.CHALLENGE, {"node": self.node, "nonce": nonce}, self.secret))
            try:
                hello = await asyncio.wait_for(frames.read_frame(reader, self.secret), HELLO_TIMEOUT_S)
            except frames.FrameError as exc:
                self.dropped_recv(exc.reason)
                if exc.reason == "version":
                    self._other_version(writer, exc)
                return
            except (TimeoutError, OSError, asyncio.IncompleteReadError):
                self.dropped_recv("no_hello")
                return
            node = self._hello_from(hello, nonce)
            if node is None or hello is None:
                return
            self._pending.pop(me, None)  # (evicted just as its HELLO came: it is a peer all the same)
            answer = self.hello("accept", node, hello.body["nonce"], idle=self.config.idle_timeout_s)
            if node == self.node:  # we dialled ourselves: our answer tells the dialler; hold no place
                writer.write(answer)
                await writer.drain()
                return
            old = self._inbound.get((local, node))
            if old is None and len(self._authed) >= self.config.max_inbound:
                self.dropped_recv("too_many_connections")
                if self.dropped["recv:too_many_connections"] == 1:  # once: a flood must not flood the log too
                    log.warning("event=mesh_inbound_refused max_inbound=%d", self.config.max_inbound)
                return
            if old is not None:  # one connection per node: the newer wins (the older may be half-open)
                old.closing = "replaced"
                old.task.cancel()
                self._authed.discard(old.task)
                self.dropped_recv("replaced")
                log.info("event=mesh_peer_replaced node=%s local=%s", node, local)
            conn = self._inbound[(local, node)] = _Inbound(me, node, local)
            self._authed.add(me)
            writer.write(answer)
            await writer.drain()
            conn.timer = asyncio.get_running_loop().call_later(self.config.idle_timeout_s, self._idle_check, conn)
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
                conn.last = time.monotonic()
                if frame.kind == frames.PING:
                    continue
                self.frames_received += 1
                self._dispatch(frame, local, node)
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return  # a cancel (close(), idle, replaced) ends it quietly: asyncio's stream callback logs otherwise
        finally:
            self._conns.discard(me)
            self._pending.pop(me, None)
            self._authed.discard(me)
            if conn is not None:
                if conn.timer is not None:
                    conn.timer.cancel()
                if self._inbound.get((local, conn.node)) is conn:
                    del self._inbound[(local, conn.node)]
                if conn.closing == "idle":
                    self.dropped_recv("idle")
                    log.warning(
                        "event=mesh_peer_idle node=%s local=%s idle_timeout_s=%g",
                        conn.node,
                        local,
                        self.config.idle_timeout_s,
                    )
            if node is not None and self._interest_conn.get(node) is me:  # it may wait anywhere now
                del self._interest_conn[node]
                self._sibling_interest.pop(node, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _hello_from(self, hello: frames.Frame | None, nonce: str) -> str | None:
        """The dialler's node id when ``hello`` answers our challenge ``nonce``; None (counted) else."""
        body = hello.body if hello is not None else None
        if hello is None or hello.kind != frames.HELLO or not isinstance(body, dict):
            self.dropped_recv("no_hello")
            return None
        if not frames.same(body.get("challenge"), nonce):  # a recorded HELLO answers an old challenge
            self.dropped_recv("replayed")
            if self.dropped["recv:replayed"] == 1:  # once: replays must not flood the log
                log.warning("event=mesh_hello_replayed (a HELLO that answers no challenge of ours)")
            return None
        node, theirs = body.get("node"), body.get("nonce")
        if (
            body.get("role") != "dial"  # an acceptor's answer, reflected
            or not frames.same(body.get("peer"), self.node)  # meant for another node
            or not isinstance(node, str)
            or not 0 < len(node) <= 128
            or not isinstance(theirs, str)
            or not 16 <= len(theirs) <= 128
        ):
            self.dropped_recv("bad_hello")
            return None
        return node

    def _idle_check(self, conn: _Inbound) -> None:
        """The idle timer of an authenticated connection: close it when no frame came for the timeout."""
        left = conn.last + self.config.idle_timeout_s - time.monotonic()
        if left > 0:
            conn.timer = asyncio.get_running_loop().call_later(left, self._idle_check, conn)
            return
        conn.timer = None
        conn.closing = "idle"
        conn.task.cancel()

    def _other_version(self, writer: asyncio.StreamWriter, exc: frames.FrameError) -> None:
        """A peer with the secret speaks another frame version (a rolling upgrade): say so, once per
        host. Only a holder of the secret gets here (the signature is checked before the version)."""
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else "local"
        if host in self._version_logged or len(self._version_logged) >= 256:
            return
        self._version_logged.add(host)
        log.warning("event=mesh_peer_version host=%s error=%s: refused until both run the same version", host, exc)

    def _dispatch(self, frame: frames.Frame, local: bool, node: str = "") -> None:
        body = frame.body
        if frame.kind == frames.INTEREST:
            if local:  # only the workers of this host filter their wakes
                self._interest(body, node)
            return
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

    def _interest(self, body: Any, node: str) -> None:
        """A sibling's INTEREST frame: record its keys; wake the new ones we pushed since it began
        waiting on them (the wake we filtered out may have crossed its INTEREST)."""
        if not frames.interest_ok(body):
            self.dropped_recv("malformed")
            return
        if body["full"]:
            state: dict[tuple[str, str], float] = {}
            self._sibling_interest[node] = state
            self._interest_conn[node] = asyncio.current_task()
        elif node in self._sibling_interest:
            state = self._sibling_interest[node]
        else:  # not told the whole set on this connection: it hears every wake anyway
            return
        for t, q in body["drop"]:
            state.pop((t, q), None)
        late: list[tuple[str, str]] = []
        for t, q, since in body["add"]:
            state[(t, q)] = since
            if self._pushed.get((t, q), self._pushed_floor) >= since:
                late.append((t, q))
        if late:
            self.wakes_caught_up += len(late)
            out = frames.key_frames(frames.WAKE, self.secret, late)
            for p in self.peers.values():
                if p.local and p.node == node:
                    for f in out:
                        p.offer(f)

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
                self._add_peer(name, unix_dialer(str(path)), local=True)
        for name in [n for n, p in self.peers.items() if p.local and n not in seen]:
            self._drop_peer(name)

    async def _scanner(self) -> None:
        while True:
            await asyncio.sleep(SCAN_INTERVAL_S)
            self._scan()
            self._sweep()

    async def run(self) -> None:
        """The supervised task: dials the peers, runs the flusher (and the sibling scanner), and on
        cancel stops them all and closes the listeners."""
        cfg = self.config
        try:
            for host, port in cfg.peers:
                self._add_peer(f"{host}:{port}", tcp_dialer(host, port), local=False)
            if cfg.local_dir is not None:
                self._scan()
                self._spawn("scanner", self._scanner())
            await asyncio.Event().wait()
        finally:
            await self.close()

    async def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
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
        max_pending=settings.mesh_max_pending,
        idle_timeout_s=settings.mesh_idle_timeout_s,
    )
    mesh = Mesh(config, on_wake=waiters.wake, on_maintenance=on_maintenance, on_config=waiters.wake)
    waiters.add_sink(mesh.publish_wake)
    if config.local_dir is not None:  # sibling workers: wake each other only where a pop waits
        mesh.interest_source = waiters
        waiters.watch_interest(mesh.publish_interest)
    return mesh


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
