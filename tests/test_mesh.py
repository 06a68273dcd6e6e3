"""The wake mesh: the frame codec (signatures, truncation, size), two in-process meshes talking over
real TCP, and two real `queen-pg serve` replicas on one PostgreSQL where a pop parked on B is woken
by a push served by A although B's own re-check is set far beyond the test's timeout."""

from __future__ import annotations

import asyncio
import os
import struct
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from queen_pg.mesh import frames
from queen_pg.mesh.node import Mesh, MeshConfig
from queen_pg.mesh.peers import Peer
from queen_pg.metrics import Metrics
from queen_pg.setting_values import parse_peers
from queen_pg.settings import Settings
from tests.conftest import free_port
from tests.helpers import eventually, until, until_healthy
from tests.replicas import Replica

SECRET = b"s3cret"


# ---- the codec ----------------------------------------------------------------------------------


def _stream(data: bytes) -> asyncio.StreamReader:
    r = asyncio.StreamReader()
    r.feed_data(data)
    r.feed_eof()
    return r


async def test_frame_round_trip_and_clean_end() -> None:
    raw = frames.encode(frames.WAKE, [["t", "q"]], SECRET, flags=frames.RELAYED)
    r = _stream(raw + raw)
    for _ in range(2):
        f = await frames.read_frame(r, SECRET)
        assert f is not None and f.kind == frames.WAKE and f.body == [["t", "q"]] and f.flags == frames.RELAYED
    assert await frames.read_frame(r, SECRET) is None  # EOF between frames: a clean end


async def test_wrong_secret_and_tampering_are_refused() -> None:
    raw = frames.encode(frames.WAKE, [["t", "q"]], SECRET)
    with pytest.raises(frames.FrameError) as e:
        await frames.read_frame(_stream(raw), b"other")
    assert e.value.reason == "bad_mac" and e.value.fatal
    tampered = bytearray(raw)
    tampered[-40] ^= 0x01  # a byte of the body
    with pytest.raises(frames.FrameError) as e:
        await frames.read_frame(_stream(bytes(tampered)), SECRET)
    assert e.value.reason == "bad_mac"
    flagged = bytearray(raw)
    flagged[6] |= frames.RELAYED  # the flags are signed too
    with pytest.raises(frames.FrameError) as e:
        await frames.read_frame(_stream(bytes(flagged)), SECRET)
    assert e.value.reason == "bad_mac"


async def test_truncated_oversize_and_malformed_frames() -> None:
    raw = frames.encode(frames.WAKE, [["t", "q"]], SECRET)
    for cut in (2, 10, len(raw) - 1):  # inside the prefix, the header, the mac
        with pytest.raises(frames.FrameError) as e:
            await frames.read_frame(_stream(raw[:cut]), SECRET)
        assert e.value.reason == "truncated"
    with pytest.raises(frames.FrameError) as e:  # refused from the prefix alone, before reading a body
        await frames.read_frame(_stream(struct.pack(">I", frames.MAX_FRAME + 1)), SECRET)
    assert e.value.reason == "oversize"
    with pytest.raises(frames.FrameError) as e:
        await frames.read_frame(_stream(struct.pack(">I", 3) + b"abc"), SECRET)
    assert e.value.reason == "malformed"
    with pytest.raises(ValueError, match="exceeds"):
        frames.encode(frames.WAKE, "x" * frames.MAX_FRAME, SECRET)


async def test_stale_and_future_frames_are_dropped_without_closing() -> None:
    old = frames.encode(frames.WAKE, [], SECRET, now_ms=1_000)
    with pytest.raises(frames.FrameError) as e:
        frames.decode(old[4:], SECRET)
    assert e.value.reason == "stale" and not e.value.fatal
    other = bytearray(frames.encode(frames.WAKE, [], SECRET))
    other[4] = frames.FRAME_VERSION + 1
    with pytest.raises(frames.FrameError) as e:
        frames.decode(bytes(other[4:]), SECRET)
    assert e.value.reason in ("bad_mac", "version")  # signed: a changed version byte never passes


def test_peer_list_and_settings_checks() -> None:
    assert parse_peers(" a:1, [::1]:7000 ,") == (("a", 1), ("::1", 7000))
    with pytest.raises(ValueError, match="host:port"):
        parse_peers("a:x")
    with pytest.raises(ValueError, match="mesh_port"):
        Settings(mesh_peers="127.0.0.1:7000")
    with pytest.raises(ValueError, match="mesh_secret"):
        Settings(mesh_port=7000, mesh_bind="0.0.0.0")
    with pytest.raises(ValueError, match="mesh_secret"):
        Settings(mesh_port=7000, mesh_peers="10.0.0.2:7000")
    assert Settings(mesh_port=7000, mesh_peers="127.0.0.1:7001").mesh_secret == ""  # loopback only: allowed
    assert Settings(mesh_port=7000, mesh_bind="0.0.0.0", mesh_secret="k").mesh_port == 7000


# ---- two meshes in this process -----------------------------------------------------------------


class Heard:
    def __init__(self) -> None:
        self.wakes: list[tuple[str, str]] = []
        self.configs: list[tuple[str, str]] = []
        self.maintenance = 0

    def mesh(
        self,
        port: int,
        peers: list[int],
        secret: bytes = SECRET,
        outbox: int = 1024,
        max_inbound: int = 64,
        **more: Any,
    ) -> Mesh:
        cfg = MeshConfig(
            secret=secret,
            port=port,
            peers=tuple(("127.0.0.1", p) for p in peers),
            outbox=outbox,
            max_inbound=max_inbound,
            **more,
        )
        return Mesh(
            cfg,
            on_wake=lambda t, q: self.wakes.append((t, q)),
            on_maintenance=lambda: setattr(self, "maintenance", self.maintenance + 1),
            on_config=lambda t, q: self.configs.append((t, q)),
        )


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


async def test_two_meshes_carry_wakes_config_and_maintenance_coalesced() -> None:
    pa, pb = free_port(), free_port()
    ha, hb = Heard(), Heard()
    a, b = ha.mesh(pa, [pb, pa]), hb.mesh(pb, [pa])  # a lists itself too: it notices and skips it
    tasks = await _running(a, b)
    try:
        await eventually(lambda: a.connected == 1 and b.connected == 1, "both directions up")
        assert a.peers[f"127.0.0.1:{pa}"].is_self
        for _ in range(100):  # a burst for one queue, published without yielding: one frame
            a.publish_wake("t", "q")
        a.publish_config("t", "q")
        a.publish_maintenance()
        await eventually(lambda: hb.maintenance == 1, "the maintenance kick")
        assert hb.wakes == [("t", "q")] and hb.configs == [("t", "q")]
        assert b.frames_received == 3  # WAKE, CONFIG, MAINTENANCE
        b.publish_wake("t2", "q2")
        await eventually(lambda: ha.wakes == [("t2", "q2")], "the wake back")
        assert ha.wakes == [("t2", "q2")] and not hb.wakes[1:]  # nobody hears their own wakes
        assert a.dropped == {}  # nothing was offered to a's own address
    finally:
        await _stop(tasks)


async def test_a_peer_without_the_secret_gets_nothing_through() -> None:
    pa, pb = free_port(), free_port()
    ha, hb = Heard(), Heard()
    good, intruder = ha.mesh(pa, []), hb.mesh(pb, [pa], secret=b"guess")
    tasks = await _running(good, intruder)
    try:
        # the intruder cannot verify our CHALLENGE, so it hangs up without a HELLO (counted)
        await eventually(lambda: good.dropped.get("recv:no_hello", 0) >= 1, "the intruder hung up")
        intruder.publish_wake("t", "q")
        assert intruder.connected == 0  # never authenticated, so its frames are dropped at the source
        reader, writer = await asyncio.open_connection("127.0.0.1", pa)  # raw bytes: a garbage frame
        writer.write(struct.pack(">I", frames.MAX_FRAME + 10) + b"junk")
        await writer.drain()
        challenge = await frames.read_frame(reader, SECRET)  # all it gets: the CHALLENGE, then closed on it
        assert challenge is not None and challenge.kind == frames.CHALLENGE
        assert await reader.read() == b""
        writer.close()
        assert good.dropped.get("recv:oversize") == 1 and ha.wakes == [] and good.frames_received == 0
    finally:
        await _stop(tasks)


async def test_silent_dials_beyond_max_inbound_do_not_lock_a_real_peer_out() -> None:
    """More TCP connections than max_inbound (64) that never say HELLO: a real peer still connects at
    once and its wake crosses, before any of the silent ones has timed out. Only authenticated peers
    count against max_inbound; the silent ones wait in a small pool of their own, oldest out first."""
    pa, pb = free_port(), free_port()
    heard = asyncio.Event()
    good = Mesh(MeshConfig(secret=SECRET, port=pa), on_wake=lambda t, q: heard.set())
    tasks = await _running(good)
    n = good.config.max_inbound + 6
    held = [await asyncio.open_connection("127.0.0.1", pa) for _ in range(n)]
    try:
        await eventually(lambda: sum(good.dropped.values()) + len(good._conns) >= n, "every silent dial accepted")
        peer = Heard().mesh(pb, [pa])
        tasks += await _running(peer)
        await eventually(lambda: peer.connected == 1, "the real peer connected")
        peer.publish_wake("t", "q")
        await asyncio.wait_for(heard.wait(), 10)
        assert good.dropped.get("recv:no_hello", 0) == 0  # no silent dial had to time out to make room
        assert good.dropped.get("recv:too_many_connections", 0) == 0
    finally:
        for _, w in held:
            w.close()
        await _stop(tasks)


async def test_pending_dials_push_out_the_oldest_and_authenticated_peers_are_capped() -> None:
    """Dials that have not said HELLO have their own pool (max_pending): a new one closes the oldest
    (counted). max_inbound counts authenticated peers: beyond it a peer is closed after its HELLO
    (counted, logged once) and gets in once a place frees."""
    pa, pb, pc = free_port(), free_port(), free_port()
    ha = Heard()
    good = ha.mesh(pa, [], max_inbound=1, max_pending=2)
    tasks = await _running(good)
    held = [await asyncio.open_connection("127.0.0.1", pa) for _ in range(2)]
    try:
        await eventually(lambda: len(good._pending) == 2, "both silent dials pending")
        third = await asyncio.open_connection("127.0.0.1", pa)
        held.append(third)
        said = await asyncio.wait_for(held[0][0].read(), 5)  # the oldest: closed on it, after its CHALLENGE
        assert frames.decode(said[4:], SECRET).kind == frames.CHALLENGE
        await eventually(lambda: len(good._pending) == 2, "the newest pending in its place")
        assert good.dropped == {"recv:pending_evicted": 1}
        b, c = Heard().mesh(pb, [pa]), Heard().mesh(pc, [pa])
        first = await _running(b)
        await eventually(lambda: b.connected == 1, "a real peer in, past the silent dials")
        second = await _running(c)
        await eventually(lambda: good.dropped.get("recv:too_many_connections", 0) >= 1, "the second peer refused")
        assert c.connected == 0 and len(good._pending) <= 2
        await _stop(first)
        await eventually(lambda: c.connected == 1, "the second peer in once the first left")
        c.publish_wake("t", "q")
        await eventually(lambda: ha.wakes == [("t", "q")], "its wake heard")
        tasks += second
    finally:
        for _, w in held:
            w.close()
        await _stop(tasks)


@pytest.fixture
async def dialled() -> AsyncIterator[tuple[Mesh, Mesh, Heard, int]]:
    """Mesh a, connected to mesh b (on port pb, heard by hb): (a, b, hb, pb)."""
    pa, pb = free_port(), free_port()
    ha, hb = Heard(), Heard()
    a, b = ha.mesh(pa, [pb]), hb.mesh(pb, [])
    tasks = await _running(a, b)
    try:
        await eventually(lambda: a.connected == 1, "a dialled b")
        yield a, b, hb, pb
    finally:
        await _stop(tasks)


async def test_a_frame_for_an_idle_peer_is_written_at_once_and_queued_only_behind_others(
    dialled: tuple[Mesh, Mesh, Heard, int],
) -> None:
    a, _, hb, pb = dialled
    peer = a.peers[f"127.0.0.1:{pb}"]

    sent = a.frames_sent
    peer.offer(frames.encode(frames.WAKE, [["t", "q1"]], SECRET))
    # written in the offering call: no outbox, no writer task between the publisher and the socket
    assert a.frames_sent == sent + 1 and peer.outbox.qsize() == 0
    await eventually(lambda: hb.wakes == [("t", "q1")], "b heard it")
    # a frame offered while another waits in the outbox queues behind it: order is kept
    peer.outbox.put_nowait(frames.encode(frames.WAKE, [["t", "q2"]], SECRET))
    peer.offer(frames.encode(frames.WAKE, [["t", "q3"]], SECRET))
    await eventually(lambda: len(hb.wakes) == 3, "b heard both")
    assert hb.wakes == [("t", "q1"), ("t", "q2"), ("t", "q3")]
    assert a.dropped == {}


async def test_publishing_never_waits_for_a_slow_or_absent_peer() -> None:
    h = Heard()
    m = h.mesh(free_port(), [])
    peer = Peer(m, "slow", lambda: asyncio.open_connection("127.0.0.1", 9), local=False, limit=2)
    peer.offer(b"x")  # not connected: dropped
    assert m.dropped == {"send:peer_down": 1}
    peer.connected = True  # connected but its writer never drains the outbox
    for _ in range(5):
        peer.offer(b"x")
    assert peer.outbox.qsize() == 2 and m.dropped["send:queue_full"] == 3


async def test_workers_of_one_host_find_each_other_and_relay(tmp_path: Path) -> None:
    """Two 'workers' share a Unix-socket directory; a remote replica's frame reaching one of them is
    relayed once to the other."""
    local = tmp_path / "mesh"
    local.mkdir()
    hw1, hw2, hr = Heard(), Heard(), Heard()
    pr, pw = free_port(), free_port()
    w1 = Mesh(MeshConfig(secret=SECRET, port=pw, local_dir=local), on_wake=lambda t, q: hw1.wakes.append((t, q)))
    remote = hr.mesh(pr, [pw])
    await w1.start()
    # the second worker, named by a live pid (pid 1); a socket of a dead pid is removed by the scan
    w2 = Mesh(MeshConfig(secret=SECRET, local_dir=local), on_wake=lambda t, q: hw2.wakes.append((t, q)))
    w2_sock = local / "1.sock"
    dead = local / f"{2**22 + 7}.sock"  # above pid_max's default: no such process
    dead.touch()
    w2_server = await asyncio.start_unix_server(lambda r, w: w2._accept(r, w, True), str(w2_sock))
    tasks = [asyncio.create_task(w1.run()), *await _running(remote)]
    try:
        await eventually(lambda: w1.peers.get(f"unix:{w2_sock.name}") is not None, "the sibling found")
        assert not dead.exists() and f"unix:{dead.name}" not in w1.peers
        await eventually(lambda: w1.connected == 1 and remote.connected == 1, "connections up")
        remote.publish_wake("t", "q")
        await eventually(lambda: hw2.wakes == [("t", "q")], "the relayed wake")
        assert hw1.wakes == [("t", "q")] and w1.frames_relayed == 1
        w1.publish_wake("t", "local")  # a worker's own wake goes to its siblings
        await eventually(lambda: ("t", "local") in hw2.wakes, "the sibling wake")
    finally:
        await _stop(tasks)
        w2_server.close()


# ---- coalescing and interest between sibling workers ---------------------------------------------


async def test_a_lone_wake_leaves_in_the_next_tick_and_a_burst_of_one_tick_is_one_frame(
    dialled: tuple[Mesh, Mesh, Heard, int],
) -> None:
    a, b, hb, _ = dialled
    a.publish_wake("t", "lone")
    assert a.frames_sent == 0  # not written inside the push's own call...
    await asyncio.sleep(0)  # ...but in the very next loop iteration: no timer, no task hop
    assert a.frames_sent == 1
    await eventually(lambda: hb.wakes == [("t", "lone")], "the lone wake")
    keys = [("t", f"q{i}") for i in range(50)]
    for k in keys + keys:  # 100 publishes in one tick, 50 distinct keys
        a.publish_wake(*k)
    await eventually(lambda: len(hb.wakes) == 51, "the burst")
    assert sorted(hb.wakes[1:]) == sorted(keys)  # each key once
    assert a.frames_sent == 2 and b.frames_received == 2  # one frame for the whole burst


class Sibling:
    """A worker's mesh and waiters, wired as `serve --workers N` wires them (mesh.from_settings)."""

    def __init__(self, local: Path, sock: str | None) -> None:
        from queen_pg.engine.waiters import Waiters

        self.waiters = Waiters(limit=100)
        self.mesh = Mesh(MeshConfig(secret=SECRET, local_dir=local), on_wake=self.waiters.wake)
        self.waiters.add_sink(self.mesh.publish_wake)
        self.mesh.interest_source = self.waiters
        self.waiters.watch_interest(self.mesh.publish_interest)
        self.sock = sock  # None: its own <pid>.sock (mesh.start); else a name of a live pid, served here
        self.server: asyncio.Server | None = None

    async def start(self, local: Path) -> asyncio.Task[None]:
        if self.sock is None:
            await self.mesh.start()
        else:
            path = local / self.sock
            self.server = await asyncio.start_unix_server(lambda r, w: self.mesh._accept(r, w, True), str(path))
            self.mesh._sock_path = path
        return asyncio.create_task(self.mesh.run())

    def knows(self, other: Sibling) -> dict[tuple[str, str], float] | None:
        return self.mesh._sibling_interest.get(other.mesh.node)


async def _siblings(tmp_path: Path) -> tuple[Sibling, Sibling, list[asyncio.Task[None]]]:
    local = tmp_path / "mesh"
    local.mkdir()
    w1, w2 = Sibling(local, None), Sibling(local, "1.sock")  # pid 1: alive, so the scans keep it
    tasks = [await w1.start(local), await w2.start(local)]
    await eventually(lambda: w1.mesh.connected == 1 and w2.mesh.connected == 1, "the siblings connected")
    await eventually(lambda: w1.knows(w2) is not None and w2.knows(w1) is not None, "the interest exchanged")
    return w1, w2, tasks


async def _stop_siblings(tasks: list[asyncio.Task[None]], *ws: Sibling) -> None:
    await _stop(tasks)
    for w in ws:
        if w.server is not None:
            w.server.close()


async def test_siblings_send_each_other_only_the_wakes_a_pop_waits_for(tmp_path: Path) -> None:
    """Nobody waits on w2: w1's pushes cost w2 no frame (and w1 none either), while a remote replica
    still hears every wake; once a pop on w2 waits on a queue, w1's pushes there wake it."""
    w1, w2, tasks = await _siblings(tmp_path)
    hr = Heard()
    pr = free_port()
    remote = hr.mesh(pr, [])
    await remote.start()
    w1.mesh.peers["remote"] = Peer(w1.mesh, "remote", lambda: asyncio.open_connection("127.0.0.1", pr), False, 64)
    tasks += [asyncio.create_task(remote.run()), asyncio.create_task(w1.mesh.peers["remote"].run())]
    try:
        await eventually(lambda: w1.mesh.connected == 2, "w1 dialled the remote replica")
        assert w1.knows(w2) == {} and w2.knows(w1) == {}
        received, sent = w2.mesh.frames_received, w1.mesh.frames_sent
        for i in range(20):
            w1.waiters.notify("t", f"idle{i}")
        await eventually(lambda: len(hr.wakes) == 20, "the remote replica hears every wake")
        assert w1.mesh.wakes_filtered == 20 and w2.mesh.frames_received == received
        assert w1.mesh.frames_sent == sent + 1  # the remote's frame only
        ev = w2.waiters.subscribe("t", "q")  # a pop on w2 starts waiting
        await eventually(lambda: ("t", "q") in (w1.knows(w2) or {}), "w1 told")
        assert not ev.is_set() and w1.mesh.wakes_caught_up == 0  # w1 never pushed q: nothing to catch up
        w1.waiters.notify("t", "q")
        w1.waiters.notify("t", "other")
        await eventually(ev.is_set, "the pop on w2 woken by w1's push")
        assert w1.mesh.wakes_filtered == 21  # "other" still filtered
        w2.waiters.release("t", "q", ev)
        assert ("t", "q") in w2.waiters.interest()  # lingers: a re-polling consumer does not flip it
    finally:
        await _stop_siblings(tasks, w1, w2)
        await remote.close()


async def test_a_pop_that_starts_waiting_as_a_sibling_push_commits_is_woken(tmp_path: Path) -> None:
    """The race: w2's pop subscribes (its claim has not run), and in the same tick, before its
    INTEREST reaches w1, w1 publishes a push of that queue and filters it out. w1 answers the INTEREST
    (whose time precedes the push) with the wake, so the pop does not sleep to its re-check."""
    w1, w2, tasks = await _siblings(tmp_path)
    try:
        ev = w2.waiters.subscribe("t", "race")
        w1.waiters.notify("t", "race")  # crosses the INTEREST: w1 does not know yet
        await eventually(ev.is_set, "the pop woken although its INTEREST crossed the wake")
        assert w1.mesh.wakes_filtered == 1 and w1.mesh.wakes_caught_up == 1
        metrics = Metrics(multiprocess_dir="")  # and a scrape shows both counts, once per sampling
        for _ in range(2):
            metrics.sample(None, None, None, None, w1.mesh)
        text = metrics.render().decode()
        assert 'queen_mesh_wakes_total{outcome="filtered"} 1.0' in text
        assert 'queen_mesh_wakes_total{outcome="caught_up"} 1.0' in text
    finally:
        await _stop_siblings(tasks, w1, w2)


async def test_interest_dropped_after_the_linger_and_sent_whole_again_after_a_reconnect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from queen_pg.mesh import node

    w1, w2, tasks = await _siblings(tmp_path)
    try:
        ev = w2.waiters.subscribe("t", "a")
        keep = w2.waiters.subscribe("t", "b")
        await eventually(lambda: set(w1.knows(w2) or {}) == {("t", "a"), ("t", "b")}, "w1 told both")
        w2.waiters.release("t", "a", ev)
        w2.mesh._sweep()  # within the linger: kept
        assert set(w2.waiters.interest()) == {("t", "a"), ("t", "b")}
        monkeypatch.setattr(node, "INTEREST_LINGER_S", 0.0)
        w2.mesh._sweep()
        await eventually(lambda: set(w1.knows(w2) or {}) == {("t", "b")}, "w1 told a is dropped")
        received = w2.mesh.frames_received
        w1.waiters.notify("t", "a")
        await asyncio.sleep(0)
        assert w1.mesh.wakes_filtered == 1 and w2.mesh.frames_received == received
        # w2's connection to w1 breaks: w1 no longer knows w2's interest, so it sends w2 everything
        peer = next(iter(w2.mesh.peers.values()))
        assert peer._writer is not None
        peer._writer.transport.abort()
        await eventually(lambda: w1.knows(w2) is None, "w1 forgot w2's interest with the connection")
        # w2 redials and starts with its whole interest; the pop still waiting on b is woken by w1
        await eventually(lambda: set(w1.knows(w2) or {}) == {("t", "b")}, "the whole set again")
        w1.waiters.notify("t", "b")
        await eventually(keep.is_set, "the pop on b woken after the reconnect")
    finally:
        await _stop_siblings(tasks, w1, w2)


async def test_a_malformed_interest_frame_is_dropped_and_a_remote_one_ignored(tmp_path: Path) -> None:
    w1, w2, tasks = await _siblings(tmp_path)
    try:
        node_ = w2.mesh.node
        w1.mesh._dispatch(frames.Frame(frames.INTEREST, 0, 0, {"full": True, "add": [["t"]], "drop": []}), True, node_)
        assert w1.mesh.dropped == {"recv:malformed": 1} and w1.knows(w2) == {}
        body = {"full": True, "add": [["t", "q", 0.0]], "drop": []}
        w1.mesh._dispatch(frames.Frame(frames.INTEREST, 0, 0, body), False, node_)  # not a sibling
        assert w1.knows(w2) == {}
    finally:
        await _stop_siblings(tasks, w1, w2)


def test_a_key_waited_on_again_forgets_what_its_groups_knew_only_when_interest_is_tracked() -> None:
    """While nobody waited on a key, siblings did not send its wakes: a probe group's "known empty"
    from before is stale once a pop waits there again. Without interest tracking (one worker, every
    wake arrives) the state is kept."""
    from queen_pg.engine.waiters import Waiters

    for tracked in (True, False):
        w = Waiters(limit=10)
        told: list[tuple[str, str, float]] = []
        if tracked:
            w.watch_interest(lambda t, q, since, told=told: told.append((t, q, since)))
        ev = w.subscribe("t", "q")
        g = w.probe("t", "q", "g", None)
        assert g.end(g.epoch, found=False, probing=False, now=0.0) and g.known_empty()
        w.leave(g)
        w.release("t", "q", ev)
        assert w.expire_interest(now=1e12, linger=1.0) == ([("t", "q")] if tracked else [])
        w.subscribe("t", "q")
        assert g.known_empty() is not tracked
        assert [k[:2] for k in told] == ([("t", "q"), ("t", "q")] if tracked else [])


# ---- two real replicas --------------------------------------------------------------------------

SLOW = {"pop_poll_interval_ms": 60_000, "pop_poll_max_ms": 600_000}  # B's own re-check: never in a test


async def _park_then_push(a: Replica, b: Replica, queue: str, timeout_ms: int) -> httpx.Response:
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(f"{a.url}/api/v1/configure", json={"queue": queue})
        assert r.status_code == 200
        pop = asyncio.create_task(
            http.get(f"{b.url}/api/v1/pop/queue/{queue}", params={"wait": "true", "timeout": timeout_ms})
        )
        await until(lambda: _parked(b, 1), "the pop to park on B")
        r = await http.post(f"{a.url}/api/v1/push", json={"items": [{"queue": queue, "payload": {"n": 1}}]})
        assert r.status_code == 201
        return await pop


async def _parked(r: Replica, n: int) -> bool:
    return await r.parked() == n


async def test_a_push_on_a_wakes_a_pop_parked_on_b(db_url: str, tmp_path: Path) -> None:
    pa, pb = free_port(), free_port()
    peers = f"127.0.0.1:{pa},127.0.0.1:{pb}"  # the same list on both replicas
    a = Replica(db_url, tmp_path, "a", mesh_port=pa, mesh_peers=peers, mesh_secret="k", jobs_enabled=0)
    b = Replica(db_url, tmp_path, "b", mesh_port=pb, mesh_peers=peers, mesh_secret="k", jobs_enabled=0, **SLOW)
    await asyncio.gather(a.start(), b.start())
    try:

        async def meshed() -> bool:
            async with httpx.AsyncClient() as c:
                text = (await c.get(f"{a.url}/metrics")).text + (await c.get(f"{b.url}/metrics")).text
            return text.count("queen_mesh_peers_connected 1.0") == 2

        await until(meshed, "the replicas to connect")
        # the pop's own timeout (30 s) is far below B's re-check (60 s): only the mesh can answer it
        r = await _park_then_push(a, b, "meshq", 30_000)
        assert r.status_code == 200 and r.json()["messages"][0]["data"] == {"n": 1}
        async with httpx.AsyncClient() as c:
            text = (await c.get(f"{b.url}/metrics")).text
        assert 'queen_mesh_frames_total{direction="received"}' in text
        # what the dashboard's overview shows as "replicas seen": A names B as a connected replica
        async with httpx.AsyncClient() as c:
            (w,) = (await c.get(f"{a.url}/api/v1/analytics/worker-metrics")).json()["workers"]
        assert [(p["name"], p["worker"], p["connected"]) for p in w["mesh"]["peers"]] == [
            (f"127.0.0.1:{pb}", False, True)
        ], w["mesh"]
        assert w["mesh"]["framesSent"] >= 1
    finally:
        a.stop()
        b.stop()


async def test_without_the_mesh_the_pop_on_b_is_not_woken(db_url: str, tmp_path: Path) -> None:
    """The control: the same replicas without a mesh; B's pop runs out its timeout empty."""
    a = Replica(db_url, tmp_path, "a", jobs_enabled=0)
    b = Replica(db_url, tmp_path, "b", jobs_enabled=0, **SLOW)
    await asyncio.gather(a.start(), b.start())
    try:
        r = await _park_then_push(a, b, "plainq", 2_000)
        assert r.status_code == 204
    finally:
        a.stop()
        b.stop()


# ---- the workers of one host --------------------------------------------------------------------


async def test_workers_of_one_serve_wake_each_other(tmp_path: Path) -> None:
    """`serve --workers 2`: pops parked on both workers (12 connections, the kernel spreads them) are
    all answered by pushes, whichever worker served the push, although the re-check is 60 s away."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_") and k != "DATABASE_URL"}
    env.update(
        PORT=str(port),
        QUEEN_HOST="127.0.0.1",
        QUEEN_DATA_DIR=str(tmp_path / "data"),
        QUEEN_PG_PORT=str(free_port()),
        QUEEN_DB_POOL_SIZE="4",
        QUEEN_POP_POLL_INTERVAL_MS="60000",
        QUEEN_POP_POLL_MAX_MS="600000",
    )
    log_path = tmp_path / "out.log"
    proc = _spawn([sys.executable, "-m", "queen_pg.cli", "serve", "--workers", "2"], env, log_path)
    base = f"http://127.0.0.1:{port}"
    try:

        def alive() -> None:
            assert proc.poll() is None, log_path.read_text()

        await until_healthy(base, "the workers", 60, alive)

        async def scrape(name: str) -> float:
            async with httpx.AsyncClient() as c:
                text = (await c.get(f"{base}/metrics")).text
            return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))

        await until(lambda: _at_least(scrape("queen_mesh_peers_connected"), 2), "the workers to connect", within=20)
        async with httpx.AsyncClient(base_url=base) as http:
            assert (await http.post("/api/v1/configure", json={"queue": "wq"})).status_code == 200

        async def pop_once() -> httpx.Response:
            async with httpx.AsyncClient(base_url=base, timeout=60) as c:
                return await c.get("/api/v1/pop/queue/wq", params={"wait": "true", "timeout": 30_000})

        pops = [asyncio.create_task(pop_once()) for _ in range(12)]
        await until(lambda: _at_least(scrape("queen_longpoll_waiters"), 12), "12 pops parked", within=20)
        for i in range(12):
            async with httpx.AsyncClient(base_url=base) as http:  # a new connection each: either worker
                item = {"queue": "wq", "partition": f"p{i}", "payload": i}
                assert (await http.post("/api/v1/push", json={"items": [item]})).status_code == 201
        answers = await asyncio.gather(*pops)
        assert [a.status_code for a in answers] == [200] * 12
        assert await scrape('queen_mesh_frames_total{direction="received"}') >= 1  # across workers
    finally:
        proc.terminate()
        proc.wait(60)


def _spawn(cmd: list[str], env: dict[str, str], log_path: Path) -> Any:
    with open(log_path, "wb") as log:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=log)


async def _at_least(value: Any, n: float) -> bool:
    return float(await value) >= n


async def test_a_maintenance_frame_makes_the_refresher_read_now(db: Any) -> None:
    """MAINTENANCE frames kick the refresher: the switch is read at once, not at its next tick (an
    hour away here)."""
    from queen_pg.engine import maintenance
    from queen_pg.jobs.maintenance import MaintenanceRefresher

    here, elsewhere = maintenance.Maintenance(), maintenance.Maintenance()
    refresher = MaintenanceRefresher(db, here, interval_s=3600)
    task = asyncio.create_task(refresher.run())
    try:
        await maintenance.set_switch(db, elsewhere, "pop", True)  # flipped through another replica
        assert here.pop is False  # not read yet (the first tick is an hour away)
        refresher.kick()
        await eventually(lambda: here.pop is True, "the kicked re-read")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
