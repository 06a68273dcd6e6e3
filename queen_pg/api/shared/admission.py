"""Admission by Content-Length, as a pure ASGI middleware: decided before the body is read.

A push (``POST /api/v1/push``) or a transaction (``POST /api/v1/transaction``) takes permits from one
byte budget (``admit_max_mb``) sized by its Content-Length, so a request that has to wait holds only
its connection and its bytes stay in the socket. A body without Content-Length (chunked) starts with
``min(1 MiB, max_body_bytes)`` and is charged for the bytes actually read, in growing steps taken before
the app sees them: while it waits for more permits its bytes stay in the socket too, so chunked bodies
held open cannot buffer more than the budget either. That wait is short (``GROW_HOLD_S``, then 429):
bodies holding permits while waiting for more could otherwise wait on each other. The wait is
first come, first served and lasts at most ``admit_hold_ms`` (jittered +-20 %); then the answer is 429
``overloaded`` with ``Retry-After`` 1-5 s. The permits go back once the response has been sent (or the
request ended otherwise). A push while storage is full is 507 ``storage_full`` at once; a transaction
is checked by its route, which knows whether it pushes.

Tenants (tenancy on): a request first takes its bytes from its tenant's own gate, of
``admit_tenant_share`` of the budget (at least one largest body), and waits there behind its own
tenant's requests only; then from the shared budget. So one tenant holds or queues for at most its
share of the budget, and the rest stays for the others: a flood cannot starve them. Gates are dropped
when idle (no bytes held, nobody waiting).

What a request decodes to (zstd, base64; ``decoded.py``) is charged to the same budget, before it is
decoded, by the route that decodes it: for a push or a transaction on top of its body's bytes.

The budget and the storage flag live on the app state (created by the lifespan), found through
``scope["app"]``; before the lifespan ran, requests pass through.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import orjson
from starlette.types import Message, Receive, Scope, Send

from queen_pg.api.shared.middleware import HttpMiddleware
from queen_pg.errors import OVERLOADED, STORAGE_FULL, QueenError
from queen_pg.limiter import FairSemaphore, OverloadLog, QueueFull, retry_after, tenant_part
from queen_pg.security.middleware import STATE_KEY as PRINCIPAL_KEY

DEFAULT_COST = 1024 * 1024  # a request without Content-Length (chunked) counts this much (at most max body)
# What one item of a push or transaction holds while it is served (its message, frame, hash, id and
# result: ~5.5 KiB measured for a 10,000-item push of tiny payloads, whose body charged 25 bytes each).
ITEM_COST = 4096
PERMIT = "queen.permit"  # the scope key of the request's Permit (charge_items)
ADMITTED = {"/api/v1/push": "push", "/api/v1/transaction": "transaction"}
JITTER = 0.2
GROW_HOLD_S = 1.0  # longest a chunked body waits for more permits (then 429)


@dataclass(slots=True)
class ByteBudget:
    """The admission budget of one broker process."""

    capacity: int
    max_body: int
    hold_s: float
    max_waiters: int = 10_000
    tenant_share: float = 1.0  # < 1: each tenant's gate holds this part of the capacity
    max_decoded: int = 0  # what one request may decode to besides its body (queen_pg/api/shared/decoded.py)
    sem: FairSemaphore = field(init=False)
    log: OverloadLog = field(init=False)
    rng: random.Random = field(default_factory=random.Random)
    gates: dict[str, FairSemaphore] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sem = FairSemaphore(self.capacity, self.max_waiters)
        self.log = OverloadLog("push", "admission")

    @property
    def tenant_capacity(self) -> int | None:
        """Each tenant's part of the budget (None: no per-tenant share); never less than one largest body
        and its decoded bytes."""
        return tenant_part(self.capacity, self.tenant_share, self.max_body + self.max_decoded)

    def gate(self, tenant: str | None) -> FairSemaphore | None:
        """The tenant's gate (None: no per-tenant share, or no tenant)."""
        part = self.tenant_capacity
        if tenant is None or part is None:
            return None
        g = self.gates.get(tenant)
        if g is None:
            for name in [n for n, x in self.gates.items() if x.used == 0 and x.queued == 0]:
                del self.gates[name]  # idle
            g = self.gates[tenant] = FairSemaphore(part, self.max_waiters)
        return g

    def release(self, cost: int, tenant: str | None = None) -> None:
        self.sem.release(cost)
        g = self.gates.get(tenant) if tenant is not None else None
        if g is not None:
            g.release(cost)

    def cost(self, content_length: int | None) -> int:
        if content_length is None:
            return min(DEFAULT_COST, self.max_body)
        return max(content_length, 1)

    async def acquire(self, cost: int, family: str, hold_s: float | None = None, tenant: str | None = None) -> None:
        """Take ``cost`` bytes (from the tenant's gate, then the shared budget) or raise 429
        ``overloaded`` after the jittered hold (``hold_s``, by default the configured one)."""
        gate = self.gate(tenant)
        gated = gate is None or gate.try_acquire(cost)  # holds its tenant's part
        if gated and self.sem.try_acquire(cost):
            self.log.admitted()
            return
        hold = (self.hold_s if hold_s is None else hold_s) * self.rng.uniform(1 - JITTER, 1 + JITTER)
        clock = asyncio.get_running_loop().time
        deadline = clock() + hold
        try:
            if gate is not None and not gated:
                await gate.acquire(cost, hold)  # behind this tenant's own requests only
                gated = True
            await self.sem.acquire(cost, max(deadline - clock(), 0.001))
        except BaseException as exc:
            if gate is not None and gated:
                gate.release(cost)
            if not isinstance(exc, TimeoutError | QueueFull):
                raise
            why = "queue_full" if isinstance(exc, QueueFull) else "hold_expired"
            self.log.family = family
            self.log.refused(
                reason=why,
                budget_bytes=self.capacity,
                in_use=self.sem.used,
                waiting=self.sem.queued,
                hold_s=f"{hold:.2f}",
            )
            raise QueenError(
                OVERLOADED,
                detail=f"the broker is overloaded (admission budget: {why}); retry later",
                retry_after=retry_after(self.rng),
            ) from None

    def snapshot(self) -> dict[str, float]:
        return {
            "budget_bytes": float(self.capacity),
            "in_use_bytes": float(self.sem.used),
            "queued": float(self.sem.queued),
            "rejected_total": float(self.log.total),
        }


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def tenant_of(scope: Scope) -> str | None:
    """The request's tenant, as the security middleware (outside) resolved it; None before it ran."""
    principal = scope.get("state", {}).get(PRINCIPAL_KEY)
    tenant: str | None = getattr(principal, "tenant", None)
    return tenant


async def refuse(send: Send, err: QueenError) -> None:
    """Answer ``err`` without reading the body; the connection closes (the body is still unread)."""
    body = orjson.dumps(err.body())
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    headers += [(k.lower().encode(), v.encode()) for k, v in (err.headers() or {}).items()]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@dataclass(slots=True)
class Permit:
    """The bytes one admitted request holds; given back once (:meth:`release`)."""

    budget: ByteBudget
    family: str
    charged: int
    tenant: str | None
    chunked: bool  # no Content-Length: charged as its bytes are read (Admission.metered)
    held: bool = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.budget.release(self.charged, self.tenant)

    async def at_least(self, total: int) -> None:
        """Hold at least ``total`` bytes (at most one largest body: with what the request decodes, the
        budget and a tenant's share always hold that much), waiting as briefly as a chunked body does."""
        more = min(total, self.budget.max_body) - self.charged
        if more > 0 and self.held:
            await self.budget.acquire(more, self.family, min(self.budget.hold_s, GROW_HOLD_S), self.tenant)
            self.charged += more

    def releasing(self, send: Send) -> Send:
        """``send`` that gives the bytes back once the response's last part has been sent."""

        async def sent(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self.release()

        return sent


async def admit(scope: Scope, send: Send) -> tuple[bool, Permit | None]:
    """The admission of one request: (go on, the permit it holds: None when it is not admitted by bytes).
    Not going on means the refusal was sent. Shared by :class:`Admission` and the protocol-level data plane
    (queen_pg/api/hot.py)."""
    family = ADMITTED.get(scope["path"]) if scope["method"] == "POST" else None
    st = getattr(scope["app"].state, "queen", None) if family is not None else None
    budget: ByteBudget | None = getattr(st, "admission", None)
    if family is None or budget is None:
        return True, None
    storage = getattr(st, "storage", None)
    if family == "push" and storage is not None and storage.full:
        await refuse(send, QueenError(STORAGE_FULL, detail=f"storage is full: {storage.reason}"))
        return False, None
    length = _content_length(scope)
    charged = budget.cost(length)
    ten = tenant_of(scope)
    try:
        await budget.acquire(charged, family, tenant=ten)
    except QueenError as err:
        await refuse(send, err)
        return False, None
    permit = scope[PERMIT] = Permit(budget, family, charged, ten, length is None)
    return True, permit


async def charge_items(scope: Scope, items: int) -> None:
    """A push or transaction of ``items`` items (counted, not yet built) holds at least ``ITEM_COST``
    bytes each of the admission budget until it has answered, not only its Content-Length: a small body
    of many tiny items costs far more than its bytes once served. 429 ``overloaded`` when the budget has
    no room after a short wait."""
    permit: Permit | None = scope.get(PERMIT)
    if permit is not None and items * ITEM_COST > permit.charged:
        await permit.at_least(items * ITEM_COST)


class Admission(HttpMiddleware):
    """Byte-budget admission and the storage_full refusal for pushes and transactions."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        go, permit = await admit(scope, send)
        if not go:
            return
        if permit is None:
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, metered(permit, receive) if permit.chunked else receive, permit.releasing(send))
        finally:
            permit.release()


def metered(permit: Permit, upstream: Receive) -> Receive:
    """A chunked body: charge the bytes as they are read, before the app sees them."""
    budget = permit.budget
    seen = 0

    async def receive() -> Message:
        nonlocal seen
        message = await upstream()
        if message["type"] == "http.request" and permit.held:
            seen += len(message.get("body", b""))
            if seen > permit.charged:
                # at least double (few waits), never past the body limit (BodyLimit refuses beyond)
                more = max(seen - permit.charged, min(permit.charged, budget.max_body - permit.charged))
                # a short wait: bodies that hold permits and wait for more could otherwise
                # wait on each other (and a disconnect goes unseen while waiting)
                await budget.acquire(more, permit.family, min(budget.hold_s, GROW_HOLD_S), permit.tenant)
                permit.charged += more
        return message

    return receive
