"""The HTTP server: uvicorn with a guarded protocol, and a shutdown that drains long-polls at once.

uvicorn by itself holds a connection whose request head never completes forever (its keep-alive
timer only runs *between* requests; ``limit_concurrency`` answers 503 only once a head has arrived
and caps no connection), and on SIGTERM it waits for every running request, parked long-poll pops
included (up to their 600 s timeout). The protocol classes here add, for httptools and h11 alike:

- a head deadline: a connection whose request head has not fully arrived ``header_timeout_s``
  after its first byte (or after it was accepted) is answered 408 and closed;
- a body deadline: a request whose body stops arriving (no byte for ``body_idle_timeout_s`` while
  uvicorn is reading, i.e. not paused because the app is not reading yet) is answered 408 and closed:
  a declared Content-Length never sent would otherwise hold the connection, and the admission bytes
  charged for it, until the client goes away;
- a head cap: a request head (request line and headers) that grows past ``max_head_bytes`` is answered
  431 ``head_too_large`` and closed. The bytes are counted in ``data_received`` before they reach the
  parser (httptools builds the URL and each header by repeated concatenation, h11 buffers the head), so
  neither holds more than the cap of one head; a head is counted from its first byte, afresh for each
  request of a keep-alive connection. A head that begins in the same read as the end of the request
  before it (pipelining) is counted from the next read: it may take one read (at most 256 KiB) more;
- a connection cap: beyond ``max_connections`` open connections per process a new one takes the place
  of the oldest connection that has no request in flight and has never had a request admitted (with JWT
  on: one with a valid token; off: any that passed the security checks), which is answered 503 +
  ``Retry-After`` and closed; with no such connection the newcomer is answered so and closed at once.
  Silent or refused connections therefore cannot lock a token holder out, and the connections of clients
  that have proven themselves are never closed for a newcomer. Answers that refuse a request before it is
  admitted (400, 401, 403 from the security checks, 413 from the body limit, 408, 431) carry
  ``Connection: close``;
- the lame duck (SIGTERM with ``drain_delay_ms`` > 0): ``/health`` answers 503 ``draining`` at once,
  parked long-poll pops answer 204 and new ones do not park, every response carries
  ``Connection: close``; the listening socket stays open for ``drain_delay_ms`` so that a proxy's
  health check takes the replica out of rotation before a connection it may reuse is closed (closing
  an idle keep-alive connection under a proxy that is sending on it loses that request). Then the
  drain below. SIGINT (Ctrl-C), a second SIGTERM (2 s or more after the first: ``SAME_STOP_S``) or
  ``drain_delay_ms=0`` skip the lame duck;
- the drain: the first ``shutdown()`` uvicorn calls on a connection (graceful shutdown has begun:
  SIGTERM, SIGINT, a worker restart) wakes every parked long-poll pop, which answers 204 at once;
  requests in flight finish (up to ``shutdown_grace_s``), new connections are no longer accepted.

- the data plane from the protocol (``QUEEN_HOT_PROTOCOL=1``, httptools): a request for a hot route
  (push, pop, ack, lease extend, transaction) runs ``Transport.hot``'s handler in place of the app, in
  the same uvicorn request cycle (keep-alive, pipelining order, flow control and framing unchanged); the
  handler applies the middleware chain's rules itself, as shared functions (queen_pg/api/hot.py).

The protocol finds its :class:`Transport` in the lifespan state (``queen_pg.app`` yields it under
``STATE_KEY``), so every worker process configures its own from its own settings.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import h11
import orjson
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from queen_pg.errors import HEAD_TOO_LARGE, REQUEST_TIMEOUT, QueenError
from queen_pg.settings import Settings

try:  # the protocol uvicorn's "auto" picks
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is a dependency; h11 is uvicorn's own fallback
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

log = logging.getLogger("queen_pg.server")

STATE_KEY = "queen_transport"
PRINCIPAL_KEY = "queen_principal"  # where the security checks put an admitted request's principal (security.middleware)
FD_HEADROOM = 256  # file descriptors kept for the pool, logs, the embedded PostgreSQL's pipes
READ_MAX = 256 * 1024  # the most one read of a socket hands to data_received (asyncio and uvloop)


class HotEntry(Protocol):
    """The data plane answered from the protocol (queen_pg/api/hot.py: ``HotPath``)."""

    def app_for(self, scope: Any) -> Any | None:
        """The ASGI callable that answers this request in place of the app; None: the app does."""


@dataclass(slots=True)
class Transport:
    """What the protocol needs from the app; one per app (worker process)."""

    header_timeout_s: float
    max_connections: int
    drain_pops: Callable[[], int]  # wakes every waiting long-poll pop; returns how many
    drained_pops: int | None = None  # set by the first begin_drain()
    in_flight: int = 0  # requests running when the drain began (parked pops included)
    drain_started: float | None = None
    drain_delay_s: float = 0.0  # the lame duck's length on SIGTERM (0: none)
    draining: bool = False  # the lame duck has begun: /health is 503, responses close their connection
    refused_connections: int = 0
    evicted_connections: int = 0  # closed to make room for a newcomer at the cap (never proven)
    head_timeouts: int = 0
    max_head_bytes: int = 64 * 1024
    heads_too_large: int = 0
    token_required: bool = False  # JWT on: a connection proves itself with a valid token, not any admitted request
    # the connections that have not proven themselves yet, oldest first (a dict keeps insertion order)
    unproven: dict[_Guard, None] = field(default_factory=dict)
    body_idle_timeout_s: float = 30.0
    body_timeouts: int = 0
    hot: HotEntry | None = None  # QUEEN_HOT_PROTOCOL=1: the data plane past the ASGI middleware chain
    # uvicorn's server-wide sets (its ServerState), seen through the first connection
    connections: set[Any] | None = None
    tasks: set[asyncio.Task[None]] | None = None

    def begin_drain(self, in_flight: int) -> None:
        if self.drained_pops is None:
            self.drain_started = time.monotonic()
            self.in_flight = in_flight
            self.drained_pops = self.drain_pops()

    def begin_lame_duck(self) -> None:
        """SIGTERM's first step (see the module doc): drain the parked pops now and make every
        response in flight, and every later one, close its connection."""
        if self.draining:
            return
        self.draining = True
        log.info("event=draining delay_ms=%.0f", self.drain_delay_s * 1000)
        self.begin_drain(len(self.tasks) if self.tasks is not None else 0)
        for conn in list(self.connections or ()):
            cycle = getattr(conn, "cycle", None)
            if cycle is not None and not cycle.response_complete:
                close_after(cycle)

    def proves(self, scope: Any) -> bool:
        """The request of ``scope`` was admitted by the security checks (with JWT on: with a valid token)."""
        principal = scope.get("state", {}).get(PRINCIPAL_KEY)
        if principal is None:
            return False
        return bool(principal.authenticated) or not self.token_required

    def make_room(self) -> bool:
        """At the cap: close the oldest connection that has not proven itself and has no request in flight
        (503 + Retry-After); False when there is none. Connections found proven on the way leave the list."""
        for conn in list(self.unproven):
            if conn.transport.is_closing():
                continue
            if conn._shows_proof():
                conn._proven()
                continue
            if conn._waiting_for_head():
                self.evicted_connections += 1
                conn._disarm_head()
                conn.transport.write(TOO_MANY)
                conn.transport.close()
                return True
        return False

    def shutdown_line(self) -> str:
        took = 0.0 if self.drain_started is None else time.monotonic() - self.drain_started
        return (
            f"event=shutdown drained_pops={self.drained_pops or 0} in_flight={self.in_flight} "
            f"took_ms={took * 1000:.0f} refused_connections={self.refused_connections} "
            f"evicted_connections={self.evicted_connections} head_timeouts={self.head_timeouts} "
            f"heads_too_large={self.heads_too_large} body_timeouts={self.body_timeouts}"
        )


def close_after(cycle: Any) -> None:
    """Make a uvicorn request cycle answer with ``Connection: close`` and close the connection after
    the response: httptools adds the header when ``keep_alive`` is off, h11 when the request asked."""
    cycle.keep_alive = False
    headers = cycle.scope.get("headers")
    if isinstance(headers, list) and (b"connection", b"close") not in headers:
        headers.append((b"connection", b"close"))


# A SIGTERM this soon after the first is the same stop request, not an operator's second one: a
# `serve --workers N` worker stopped as systemd stops a unit (KillMode=control-group) or by
# `kill -TERM -<pgid>` gets the signal itself and again from uvicorn's supervisor, which relays it
# within its 0.5 s poll; taking that as "shut down now" cut the lame duck to half a second.
SAME_STOP_S = 2.0

# At shutdown a connection accepted but not yet read from gets this long to send its request head
# (it is served, then closed). A worker swapped by SIGHUP shares its listening socket with its
# successor, so such a connection is usually a client's request that merely came in last.
FRESH_GRACE_S = 1.0


def install_lame_duck(transport: Transport) -> None:
    """Put the lame duck in front of uvicorn's SIGTERM handler (called from the lifespan, after
    uvicorn installed its own; a no-op off the main thread, where uvicorn handles no signal, or with
    ``drain_delay_s`` 0). The handler only schedules: the loop does the work."""
    if transport.drain_delay_s <= 0 or threading.current_thread() is not threading.main_thread():
        return
    uvicorns = signal.getsignal(signal.SIGTERM)
    if not callable(uvicorns):
        return
    loop = asyncio.get_running_loop()
    asked_at: float | None = None

    def on_sigterm(sig: int, frame: Any) -> None:
        nonlocal asked_at
        now = time.monotonic()
        if asked_at is not None:
            if now - asked_at >= SAME_STOP_S:  # a second SIGTERM: shut down now
                uvicorns(sig, frame)
            return  # the same stop request reaching this process twice (see SAME_STOP_S)
        asked_at = now
        loop.call_soon_threadsafe(start)

    def start() -> None:
        transport.begin_lame_duck()
        loop.call_later(transport.drain_delay_s, uvicorns, signal.SIGTERM, None)

    signal.signal(signal.SIGTERM, on_sigterm)


def _raw_answer(status: bytes, body: dict[str, Any], extra: bytes = b"") -> bytes:
    payload = orjson.dumps(body)
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
        + extra
        + b"content-length: "
        + str(len(payload)).encode()
        + b"\r\n\r\n"
        + payload
    )


TOO_MANY = _raw_answer(
    b"503 Service Unavailable",
    {"error": "too many connections to this broker process; retry later", "code": "overloaded"},
    b"retry-after: 1\r\n",
)


def _timed_out(detail: str) -> bytes:
    return _raw_answer(b"408 Request Timeout", QueenError(REQUEST_TIMEOUT, detail=detail).body())


HEAD_TIMEOUT = _timed_out("the request head did not arrive in time")
BODY_TIMEOUT = _timed_out("the request body stopped arriving")


def _head_too_large(limit: int) -> bytes:
    return _raw_answer(b"431 Request Header Fields Too Large", QueenError(HEAD_TOO_LARGE, limit=limit).body())


def _cancel(timer: asyncio.TimerHandle | None) -> None:
    """Stop a clock if one is armed (a fired or cancelled one takes it as a no-op)."""
    if timer is not None:
        timer.cancel()


class _Guard:
    """Mixed into uvicorn's protocol classes; relies on their ``connections``, ``tasks``, ``cycle``,
    ``transport`` and ``loop`` attributes (uvicorn >= 0.30, both implementations)."""

    connections: set[Any]
    tasks: set[asyncio.Task[None]]
    cycle: Any
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop

    def _guard_init(self, app_state: dict[str, Any]) -> None:
        self._queen: Transport | None = app_state.get(STATE_KEY)
        self._head_cap = self._queen.max_head_bytes if self._queen is not None else sys.maxsize
        self._is_proven = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_cycle: Any = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._last_call = False  # shutdown began before this connection's first request: serve it, then close
        if self._queen is not None and self._queen.connections is None:
            self._queen.connections, self._queen.tasks = self.connections, self.tasks

    def _guard_connected(self) -> bool:
        t = self._queen
        if t is None:
            return True
        if len(self.connections) > t.max_connections and not t.make_room():
            t.refused_connections += 1
            self.transport.write(TOO_MANY)
            self.transport.close()
            return False
        t.unproven[self] = None
        self._arm_head()
        return True

    def _shows_proof(self) -> bool:
        """This connection's latest request was admitted (the security checks put its principal in its scope)."""
        c = self.cycle
        return c is not None and self._queen is not None and self._queen.proves(c.scope)

    def _proven(self) -> None:
        self._is_proven = True
        if self._queen is not None:
            self._queen.unproven.pop(self, None)

    def _guard_lost(self) -> None:
        self._disarm_head()
        self._disarm_body()
        if self._queen is not None and not self._is_proven:
            self._queen.unproven.pop(self, None)

    def _refuse_head(self) -> None:
        """The head in progress has taken ``max_head_bytes`` and goes on: 431, and close."""
        if self._queen is not None:
            self._queen.heads_too_large += 1
        self._disarm_head()
        self.transport.write(_head_too_large(self._head_cap))
        self.transport.close()

    def _waiting_for_head(self) -> bool:
        return self.cycle is None or bool(self.cycle.response_complete)

    def _arm_head(self) -> None:
        if self._queen is not None and self._head_timer is None:
            self._head_cycle = self.cycle
            self._head_timer = self.loop.call_later(self._queen.header_timeout_s, self._head_expired)

    def _disarm_head(self) -> None:
        _cancel(self._head_timer)
        self._head_timer = None

    def _before_data(self) -> None:
        if self._waiting_for_head():
            if not self._is_proven and self._shows_proof():
                self._proven()  # the request before this one was admitted: the connection is a client's
            self._arm_head()  # the first byte of a request after an idle keep-alive starts the clock

    def _after_data(self) -> None:
        if self._head_timer is not None and self.cycle is not self._head_cycle:
            self._disarm_head()  # a new request cycle: its head is complete
        self._arm_body()
        if (
            self.cycle is not None
            and self.cycle.keep_alive
            and (self._last_call or (self._queen is not None and self._queen.draining))
        ):
            close_after(self.cycle)  # the lame duck, or shutdown: this connection's last request

    def _head_expired(self) -> None:
        self._head_timer = None
        if self._waiting_for_head() and not self.transport.is_closing():
            if self._queen is not None:
                self._queen.head_timeouts += 1
            self.transport.write(HEAD_TIMEOUT)
            self.transport.close()

    def _body_pending(self) -> bool:
        """A request whose body has not all arrived, and no answer begun."""
        c = self.cycle
        return c is not None and bool(c.more_body) and not c.response_started

    def _arm_body(self) -> None:
        """(Re)start the body's idle clock after bytes arrived; stop it once the body is complete."""
        self._disarm_body()
        if self._queen is not None and self._body_pending():
            self._body_timer = self.loop.call_later(self._queen.body_idle_timeout_s, self._body_expired)

    def _disarm_body(self) -> None:
        _cancel(self._body_timer)
        self._body_timer = None

    def _body_expired(self) -> None:
        self._body_timer = None
        if not self._body_pending() or self.transport.is_closing():
            return
        flow = getattr(self, "flow", None)
        if flow is not None and flow.read_paused:  # the app has not read yet (admission): not the client's fault
            self._arm_body()
            return
        if self._queen is not None:
            self._queen.body_timeouts += 1
        self.transport.write(BODY_TIMEOUT)
        self.transport.close()  # the app's receive() sees http.disconnect (ClientDisconnect, no answer)

    def _drain(self) -> None:
        if self._queen is not None:
            self._queen.begin_drain(len(self.tasks))

    def _keep_fresh(self) -> bool:
        """At shutdown: keep a connection accepted but not yet read from (its request may already be in
        the socket: closing it would lose that request with no answer) for one request, at most
        ``FRESH_GRACE_S`` for its head; uvicorn waits for it like a request in flight."""
        if self._queen is None or self.cycle is not None or self.transport.is_closing():
            return False
        self._last_call = True
        self._disarm_head()
        self._head_cycle = None
        self._head_timer = self.loop.call_later(min(FRESH_GRACE_S, self._queen.header_timeout_s), self._head_expired)
        return True


class _Guarded(_Guard):
    """The protocol hooks, written once: listed before uvicorn's protocol class in the bases, so each
    ``super()`` call reaches the httptools or h11 implementation."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard_init(kwargs.get("app_state") or {})

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._guard_connected()

    # data_received is each implementation's own (below): it counts the bytes of a request head against
    # ``_head_cap`` before the parser sees them, and what each parser tells about a head differs

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard_lost()
        super().connection_lost(exc)  # type: ignore[misc]

    def shutdown(self) -> None:
        self._drain()
        if not self._keep_fresh():
            super().shutdown()  # type: ignore[misc]


CONTINUE = b"HTTP/1.1 100 "


class OneWrite:
    """A request cycle's view of the connection: the response head goes out with the first body chunk,
    in ONE write. uvicorn writes the head when ``http.response.start`` is sent and the body at the next
    message, two ``send()`` calls and two segments on the wire (TCP_NODELAY) for every answer; each
    costs a syscall through the loopback stack and may wake the client twice. The head (the cycle's
    first write that is not a ``100 Continue``) is held, and leaves with the next write, or at the end
    of this loop iteration (``call_soon``: a streaming body's first chunk may come later), or before a
    close, whichever comes first. Everything else goes to the transport as it is."""

    __slots__ = ("_fresh", "_head", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._head: bytes | None = None
        self._fresh = True  # the head has not been written yet

    def write(self, data: bytes) -> None:
        if self._fresh and not data.startswith(CONTINUE):
            self._fresh = False
            self._head = data
            self._loop.call_soon(self.flush)
            return
        head, self._head = self._head, None
        self._transport.write(data if head is None else head + data)

    def flush(self) -> None:
        head, self._head = self._head, None
        if head is not None and not self._transport.is_closing():
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:  # anything else uvicorn may ask of a transport
        return getattr(self._transport, name)


if HttpToolsProtocol is not None:

    class QueenHttpToolsProtocol(_Guarded, HttpToolsProtocol):  # type: ignore[misc]  # Transport vs BaseTransport
        """httptools tells when a message ends (``on_message_complete``: the next byte begins a head) and,
        by making a request cycle, when a head did; not where in a read. So ``_head_left`` counts every
        read down (a couple of integer operations) and is reset when a message completes; a read larger
        than what is left takes the slow way (:meth:`_take_capped`)."""

        _head_left = sys.maxsize  # bytes the head in progress (or the next one) may still take
        _done: Any = None  # the request cycle whose message (head and body) was parsed last

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head_left = self._head_cap

        def data_received(self, data: bytes) -> None:
            self._before_data()
            left = self._head_left - len(data)
            if left >= 0:
                self._head_left = left
                HttpToolsProtocol.data_received(self, data)
            else:
                self._take_capped(data)
            self._after_data()

        def _take_capped(self, data: bytes) -> None:
            """More bytes than the head in progress may still take: inside a body they all go to the parser;
            otherwise the parser gets only what the head may take, then we see whether it completed."""
            view = memoryview(data)
            while len(view) > self._head_left:
                c = self.cycle
                if c is not None and c is not self._done:  # a body is arriving: its bytes are not a head's
                    self._head_left = self._head_cap
                    break
                room = self._head_left
                if room == 0:  # the same head has taken the cap and goes on
                    self._refuse_head()
                    return
                self._head_left = 0  # on_message_complete resets it if a message completes
                HttpToolsProtocol.data_received(self, view[:room])  # type: ignore[arg-type]  # a buffer will do
                view = view[room:]
                if self.transport.is_closing():  # the parser refused it (400)
                    return
            else:
                self._head_left -= len(view)
            if view:
                HttpToolsProtocol.data_received(self, view)  # type: ignore[arg-type]

        def on_message_complete(self) -> None:
            # the parser calls it also when uvicorn ignores it (a request answered before its body was read)
            self._head_left = self._head_cap
            self._done = self.cycle
            HttpToolsProtocol.on_message_complete(self)

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:  # every cycle, pipelined ones included
            cycle.transport = OneWrite(self.transport, self.loop)
            hot = self._queen.hot if self._queen is not None else None
            if (
                hot is not None
                and app is self.app  # not uvicorn's own 503 (limit_concurrency)
                and not cycle.waiting_for_100_continue
                and cycle.scope["http_version"] == "1.1"
            ):
                app = hot.app_for(cycle.scope) or app  # same cycle: keep-alive, pipelining, flow control
            super()._start_asgi_task(cycle, app)


class QueenH11Protocol(_Guarded, H11Protocol):  # type: ignore[misc]  # Transport vs BaseTransport
    """h11 keeps an incomplete head in its receive buffer while the client's state is IDLE: the head's
    bytes so far are that buffer's length."""

    def data_received(self, data: bytes) -> None:
        self._before_data()
        conn = self.conn
        view = memoryview(data)
        while conn.their_state is h11.IDLE:
            room = self._head_cap - len(conn._receive_buffer)
            if len(view) <= room:
                break
            if room <= 0:  # the head in h11's buffer has taken the cap and goes on
                self._refuse_head()
                return
            H11Protocol.data_received(self, view[:room])  # type: ignore[arg-type]  # a buffer will do
            view = view[room:]
            if self.transport.is_closing():  # h11 refused it (400)
                return
        if view:
            H11Protocol.data_received(self, view)  # type: ignore[arg-type]
        self._after_data()


AUTO_PROTOCOL = (  # an import string: spawned workers resolve it themselves
    "queen_pg.server:QueenHttpToolsProtocol" if HttpToolsProtocol is not None else "queen_pg.server:QueenH11Protocol"
)


def fit_connections(wanted: int) -> int:
    """``wanted`` connections, raising the soft file-descriptor limit toward the hard one if needed;
    fewer (with a warning) when the hard limit cannot hold them plus some headroom."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + FD_HEADROOM
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < need:
        fitted = max(soft - FD_HEADROOM, 16)
        log.warning(
            "event=max_connections_lowered wanted=%d fitted=%d nofile_soft=%d nofile_hard=%d",
            wanted,
            fitted,
            soft,
            hard,
        )
        return fitted
    return wanted


def tune_gc(settings: Settings) -> None:
    """The garbage collector of a serving process (``queen-pg serve`` and each of its workers; not the
    tests, which build apps in their own process): ``settings.gc_thresholds``, and the objects alive now
    (modules, the app and its routes) moved out of the collector's sight with ``gc.freeze()``.

    Why: each parked long-poll holds ~200 container objects (the ASGI middleware chain's coroutines,
    closures, the request, its timer) for up to its timeout, so they survive into the oldest generation;
    Python collects that generation whenever a quarter of it is new, walking every object: with 2,000
    parked pops re-issued every 30 s that was a 0.1-0.6 s pause every ~7 s, most of an idle broker's CPU.
    gen0 at 10,000 lets request-scoped objects die by reference count before a young collection sees
    them; gen2 at 100 bounds the full collections to one per million net allocations (minutes when idle,
    seconds under load, where the quarter rule still decides). Cyclic garbage waits that long for a full
    collection; reference counting frees everything else at once."""
    if settings.gc_thresholds:
        g0, g1, g2 = (int(x) for x in settings.gc_thresholds.split(","))
        gc.set_threshold(g0, g1, g2)
    gc.collect()
    gc.freeze()


def uvicorn_config(app: Any, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """The uvicorn configuration of every queen-pg server (``serve``, its workers, the tests)."""
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        "access_log": False,
        "proxy_headers": False,  # X-Forwarded-*: only from trusted_proxies (queen_pg/api/shared/forwarded.py)
        "http": AUTO_PROTOCOL,
        "timeout_graceful_shutdown": settings.shutdown_grace_s,
        "timeout_keep_alive": settings.keep_alive_s,
        # h11's own check stays behind the head cap (QueenH11Protocol.data_received): it sees only a head
        # that came in one read behind the end of the request before it, as httptools may (one read more)
        "h11_max_incomplete_event_size": settings.max_head_bytes + READ_MAX,
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)
