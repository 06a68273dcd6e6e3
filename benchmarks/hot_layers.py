"""In-process cost of one request through the broker's ASGI stack, layer by layer (no HTTP, no socket).

Starts an embedded PostgreSQL, builds the real app (``create_app``) and runs its lifespan, then calls the
ASGI app directly with a fake ``receive``/``send``, one request at a time, and reports the broker CPU per
request (``time.process_time``) for:

* ``push``: a 1-item ``POST /api/v1/push`` through the whole stack (the database call included);
* ``stack``: the same middleware stack (Starlette's ServerErrorMiddleware down to HotRoutes) around an
  app that answers 200 at once, then each middleware alone around that app (what one layer costs).

The figures are warm, in-process costs: a lone request over HTTP costs more (socket wake-ups, a cold
cache). A lower bound on a shared machine: the load average is printed with them.

    python -m benchmarks.hot_layers [--requests N]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks.broker import print_load, scratch_postgres

Scope = dict[str, Any]
ASGI = Callable[[Scope, Any, Any], Awaitable[None]]

BODY = (
    b'{"items":[{"queue":"lat","partition":"p0","transactionId":"t-%010d",'
    b'"payload":{"n":1,"text":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}}]}'
)


def scope_of(app: Any, path: str, body: bytes, state: dict[str, Any]) -> Scope:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1:6632"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 6632),
        "state": dict(state),
        "app": app,
    }


async def one(app: ASGI, owner: Any, path: str, body: bytes, state: dict[str, Any]) -> int:
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.sleep(3600)  # a disconnect would be the next message
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope_of(owner, path, body, state), receive, send)
    return status


async def measure(label: str, app: ASGI, owner: Any, n: int, state: dict[str, Any], want: int, seq0: int) -> int:
    for i in range(200):  # warm-up
        got = await one(app, owner, "/api/v1/push", BODY % (seq0 + i), state)
        assert got == want, (label, got)
    seq0 += 200
    c0, w0 = time.process_time(), time.perf_counter()
    for i in range(n):
        await one(app, owner, "/api/v1/push", BODY % (seq0 + i), state)
    c1, w1 = time.process_time(), time.perf_counter()
    print(f"{label:<58} cpu {(c1 - c0) / n * 1e6:8.1f} us/req   wall {(w1 - w0) / n * 1e6:8.1f} us/req")
    return seq0 + n


async def ok_app(scope: Scope, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


def layers(app: Any) -> list[tuple[str, Any]]:
    """The built middleware stack, outermost first: (class name, instance)."""
    out, node = [], app.middleware_stack
    while node is not None:
        out.append((type(node).__name__, node))
        if type(node).__name__ == "HotRoutes":
            return out
        node = getattr(node, "app", None)
    raise RuntimeError("no HotRoutes in the stack")


async def bench(dsn: str, n: int, push_only: bool) -> None:
    from queen_pg.app import create_app
    from queen_pg.settings import Settings

    app = create_app(Settings(database_url=dsn, jobs_enabled=False))
    async with app.router.lifespan_context(app) as state:
        state = dict(state or {})
        app.middleware_stack = app.build_middleware_stack()
        seq = await measure("push through create_app's whole stack (database included)", app, app, n, state, 201, 0)
        if push_only:
            return
        stack = layers(app)
        print("stack:", " -> ".join(name for name, _ in stack))
        # the whole stack around ok_app: the innermost layer's `app` swapped
        inner = stack[-1][1]
        real, inner.app = inner.app, ok_app
        hot = inner.by_method  # HotRoutes would answer /push itself: make it pass through
        inner.by_method = {}
        seq = await measure("whole middleware stack around a bare 200 app", stack[0][1], app, n, state, 200, seq)
        inner.by_method, inner.app = hot, real
        seq = await measure("bare 200 app alone", ok_app, app, n, state, 200, seq)
        for name, node in stack:
            saved = node.app
            node.app = ok_app
            if name == "Forwarded":
                node.inner = ok_app  # no trusted proxies: it calls its app directly
            if name == "HotRoutes":
                hot, node.by_method = node.by_method, {}
            try:
                seq = await measure(f"  {name} alone around it", node, app, n, state, 200, seq)
            finally:
                node.app = saved
                if name == "Forwarded":
                    node.inner = saved
                if name == "HotRoutes":
                    node.by_method = hot


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.hot_layers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000, help="measured requests per case (default 3000)")
    ap.add_argument("--push-only", action="store_true", help="only the push through the whole stack (to profile)")
    args = ap.parse_args(argv)
    with scratch_postgres("queen-hotlayers-") as pg:
        import uvloop  # as the server runs

        uvloop.install()
        asyncio.run(bench(pg.dsn(), args.requests, args.push_only))
    print_load()


if __name__ == "__main__":
    main()
