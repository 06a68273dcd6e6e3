"""The load generator: a separate process that drives a broker over HTTP/1.1 and prints one JSON result.

    python -m benchmarks.loadgen '<json spec>'      (from the repository root)

It shares the machine with the broker and PostgreSQL, so it is made cheap: a minimal HTTP/1.1 client
on raw asyncio streams (uvloop when installed), one keep-alive connection per client, request bytes
built once from a template in which only fixed-width placeholders (sequence number, partition) are
replaced, and responses checked without parsing them where a byte search is enough. It imports nothing
from ``queen_pg`` and needs only the standard library, orjson and (optionally) uvloop.

Actions (``spec["action"]``):
- ``push``: ``clients`` connections each POST ``items`` items per request, for ``warmup`` + ``duration``
  seconds; rate = messages pushed per second in the measured window.
  With ``binary``: QPB1 flag-8 bodies framed and zstd-compressed per request, as the official client's
  ``binary_push`` + ``push_compression`` send them (``benchmarks/loadgen_binary.py``).
- ``latency``: ``push`` with one client, sequential. Every push action reports p50/p99/max of the
  latencies of its measured requests.
- ``consume``: for each consumer group in ``groups`` (``null`` = queue mode), ``consumers`` connections
  loop pop ``batch`` (no wait) + ``/ack/batch``; rate = acknowledged deliveries per second. With
  ``frames``: the pops ask for QPF1 and the answer is decoded as the official client's framed_pop does. A group
  that has acknowledged ``expect`` messages is drained: the window ends early when every group is.
- ``fill``: push ``per_partition`` messages to each of ``partitions`` partitions (from index
  ``first_partition``, 0 by default), ``per_req`` per request (not timed work: set-up for the others).
- ``pop_latency``: one client, sequential pops naming no partition (``batch=1&wait=false&autoAck=true``:
  each answer moves the cursor, nothing stays leased); p50/p99 of the answered (200) pops.

With ``root_pid`` the CPU seconds of that process tree (python processes vs postgres processes) are
read from /proc at the window's edges, with this process's own CPU and the rest of the machine's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import quote, urlsplit

import orjson

from benchmarks.httpclient import Conn, HttpError, raw_request
from benchmarks.loadgen_binary import ack_body_of_frames, binary_push_request
from benchmarks.procstat import CpuWindow

SEQ = b"@SEQ@@@@@@"  # 10 bytes, replaced by the zero-padded request sequence number
PART = b"@P@@@"  # 5 bytes, replaced by the zero-padded partition index


class Meter:
    """Counters shared by a workload's clients; the window is the difference of two snapshots."""

    def __init__(self) -> None:
        self.count = 0  # messages pushed, or deliveries acknowledged
        self.reqs = 0
        self.errors = 0
        self.rejected = 0  # 429/503 answers (overload): the client backs off as Retry-After says
        self.first_error: str | None = None
        self.latencies: list[int] | None = None  # ns, measured window only (push actions)
        self.measuring = False
        self.stop = False

    def error(self, what: str) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = what[:500]


async def timed(conn: Conn, raw: bytes, meter: Meter, t0: int, ok: int, n: int) -> tuple[int, bytes] | None:
    """One request of a client loop started at ``t0``: counted; ``ok`` adds ``n`` messages and, while
    measuring, its latency. A transport error is recorded and paced (None: the loop goes on)."""
    try:
        status, body = await conn.request(raw)
    except HttpError as exc:
        meter.error(str(exc))
        await asyncio.sleep(0.05)
        return None
    t1 = time.perf_counter_ns()
    meter.reqs += 1
    if status == ok:
        meter.count += n
        if meter.latencies is not None and meter.measuring:
            meter.latencies.append(t1 - t0)
    return status, body


async def backoff(meter: Meter, deadline: float) -> None:
    """429/503: count it and back off for a second (never past the deadline), as a client would."""
    meter.rejected += 1
    await asyncio.sleep(max(0.0, min(1.0, deadline - time.monotonic())))


def payload_json(size: int) -> bytes:
    base = b'{"kind":"bench","n":0,"text":""}'
    return base[:-2] + b"x" * max(0, size - len(base)) + b'"}'


def push_template(spec: dict[str, Any], cid: int) -> bytes:
    """The raw request for one client, with SEQ in every transactionId and PART as the partition."""
    queue, items, tag = spec["queue"], spec["items"], spec["tag"]
    payload = payload_json(spec.get("payload_bytes", 128))
    parts = [
        b'{"queue":%s,"partition":"p%s","transactionId":"%s-%04d-%s-%04d","payload":%s}'
        % (orjson.dumps(queue), PART, tag.encode(), cid, SEQ, i, payload)
        for i in range(items)
    ]
    return raw_request("POST", "/api/v1/push", b'{"items":[' + b",".join(parts) + b"]}")


async def push_client(conn: Conn, spec: dict[str, Any], cid: int, meter: Meter, deadline: float) -> None:
    binary = spec.get("binary", False)
    tpl = b"" if binary else push_template(spec, cid)
    items, clients, partitions = spec["items"], spec["clients"], spec["partitions"]
    own = spec.get("partition_mode", "own") == "own"
    for seq in itertools.count():
        if meter.stop:
            return
        part = cid % partitions if own else (cid + seq * clients) % partitions
        t0 = time.perf_counter_ns()
        if binary:  # framed and compressed per request, as the official client does (binary_push_request)
            raw = binary_push_request(spec, cid, seq, part)
        else:
            raw = tpl.replace(SEQ, b"%010d" % seq).replace(PART, b"%05d" % part)
        got = await timed(conn, raw, meter, t0, 201, items)
        if got is None:
            continue
        status, body = got
        if status in (429, 503):
            await backoff(meter, deadline)
        elif status != 201:
            meter.error(f"push {status}: {body[:300]!r}")


class Group:
    def __init__(self, name: str | None, expect: int) -> None:
        self.name, self.expect, self.done = name, expect, 0


POLL_MS = 2_000  # the consumers' long-poll timeout: short, so that the drained consumers end soon after a run


async def consume_client(
    conn: Conn, spec: dict[str, Any], group: Group, meter: Meter, drained: asyncio.Event, deadline: float
) -> None:
    q = quote(spec["queue"], safe="")
    # long-poll like the official client's consume loop (wait=true): a pop that finds every partition
    # leased parks until a push or an ack frees one (spec "poll_ms": 0 = the old wait=false + 2 ms sleep)
    poll_ms = int(spec.get("poll_ms", POLL_MS))
    wait = f"wait=true&timeout={poll_ms}" if poll_ms else "wait=false"
    path = f"/api/v1/pop/queue/{q}?batch={spec['batch']}&{wait}"
    frames = spec.get("frames", False)
    if frames:
        path += "&frames=true"
    if group.name is not None:
        path += "&consumerGroup=" + quote(group.name, safe="")
    pop_raw = raw_request("GET", path)
    gname = orjson.dumps(group.name)
    while not meter.stop:
        if group.expect and group.done >= group.expect:
            return
        try:
            status, body = await conn.request(pop_raw)
            meter.reqs += 1
            if status == 204:
                if not poll_ms:
                    await asyncio.sleep(0.002)  # every partition leased by a sibling, or drained
                continue  # (long-poll: the wait ran out, the queue is drained)
            if status != 200:
                if status in (429, 503):
                    await backoff(meter, deadline)
                else:
                    meter.error(f"pop {status}: {body[:300]!r}")
                continue
            if frames:
                n, acks = ack_body_of_frames(body)
            else:
                msgs = orjson.loads(body).get("messages") or []
                n = len(msgs)
                acks = orjson.dumps(
                    [
                        {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]}
                        for m in msgs
                    ]
                )
            if not n:
                await asyncio.sleep(0.002)
                continue
            ack_body = b'{"consumerGroup":%s,"acknowledgments":%s}' % (gname, acks)
            status, body = await conn.request(raw_request("POST", "/api/v1/ack/batch", ack_body))
            meter.reqs += 1
        except HttpError as exc:
            meter.error(str(exc))
            await asyncio.sleep(0.05)
            continue
        if status != 200 or b'"success":false' in body:
            meter.error(f"ack {status}: {body[:300]!r}")
            continue
        meter.count += n
        group.done += n
        if group.expect and group.done >= group.expect and all_done(spec):
            drained.set()


def all_done(spec: dict[str, Any]) -> bool:
    return all(g.done >= g.expect for g in spec["_groups"])


# --- actions --------------------------------------------------------------------------------------


async def connect_all(host: str, port: int, n: int) -> list[Conn]:
    conns = [Conn(host, port) for _ in range(n)]
    await asyncio.gather(*(c.connect() for c in conns))
    return conns


async def measured(
    spec: dict[str, Any], meter: Meter, tasks: list[asyncio.Task[None]], drained: asyncio.Event | None
) -> dict[str, Any]:
    """Warm up, then count what completes in the window [warmup, warmup + duration] (or until drained)."""
    cpu = CpuWindow(spec.get("root_pid"))
    await asyncio.sleep(spec["warmup"])
    cpu.begin()
    c0, r0, t0 = meter.count, meter.reqs, time.monotonic()
    meter.measuring = True
    if drained is None:
        await asyncio.sleep(spec["duration"])
    elif not drained.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(drained.wait(), spec["duration"])
    c1, r1, t1 = meter.count, meter.reqs, time.monotonic()
    # the window ended because every message was consumed, before its time: it measured a drain
    ran_dry = drained is not None and drained.is_set()
    meter.measuring = False
    usage = cpu.end()
    meter.stop = True
    _done, pending = await asyncio.wait(tasks, timeout=10)
    for t in pending:
        t.cancel()
    elapsed = max(t1 - t0, 1e-9)
    return {
        "count": c1 - c0,
        "requests": r1 - r0,
        "elapsed_s": round(elapsed, 3),
        "rate": (c1 - c0) / elapsed,
        "errors": meter.errors,
        "rejected": meter.rejected,
        "first_error": meter.first_error,
        "cpu_cores": usage,
        "ran_dry": ran_dry,
    }


def latency_summary(lat_ns: list[int]) -> dict[str, float] | None:
    """p50, p99 and max in ms of request latencies in ns (None without any)."""
    if not lat_ns:
        return None
    lat = sorted(lat_ns)
    n = len(lat)
    return {"p50": lat[n // 2] / 1e6, "p99": lat[min(n - 1, (n * 99) // 100)] / 1e6, "max": lat[-1] / 1e6, "samples": n}


async def run_push(spec: dict[str, Any], host: str, port: int) -> dict[str, Any]:
    meter = Meter()
    meter.latencies = []
    conns = await connect_all(host, port, spec["clients"])
    deadline = time.monotonic() + spec["warmup"] + spec["duration"]
    tasks = [asyncio.create_task(push_client(c, spec, i, meter, deadline)) for i, c in enumerate(conns)]
    out = await measured(spec, meter, tasks, None)
    if meter.latencies:
        out["latency_ms"] = latency_summary(meter.latencies)
    for c in conns:
        c.close()
    return out


async def run_consume(spec: dict[str, Any], host: str, port: int) -> dict[str, Any]:
    meter = Meter()
    groups = spec["_groups"] = [Group(g, spec.get("expect", 0)) for g in spec["groups"]]
    per = spec["consumers"]
    conns = await connect_all(host, port, per * len(groups))
    drained = asyncio.Event()
    deadline = time.monotonic() + spec["warmup"] + spec["duration"]
    tasks = [
        asyncio.create_task(consume_client(conns[gi * per + k], spec, g, meter, drained, deadline))
        for gi, g in enumerate(groups)
        for k in range(per)
    ]
    out = await measured(spec, meter, tasks, drained if spec.get("expect") else None)
    out["per_group"] = [g.done for g in groups]
    out["left_per_group"] = [max(0, g.expect - g.done) for g in groups]  # at the end of the run (after the window)
    for c in conns:
        c.close()
    return out


async def run_fill(spec: dict[str, Any], host: str, port: int) -> dict[str, Any]:
    """Push ``per_partition`` messages to each partition ``p00000``…; bodies of ``per_req`` items."""
    queue, tag = spec["queue"], spec["tag"]
    payload = payload_json(spec.get("payload_bytes", 128))
    qj = orjson.dumps(queue)

    def bodies() -> Any:
        batch: list[bytes] = []
        first = spec.get("first_partition", 0)
        for p in range(first, first + spec["partitions"]):
            for i in range(spec["per_partition"]):
                batch.append(
                    b'{"queue":%s,"partition":"p%05d","transactionId":"%s-f-%05d-%08d","payload":%s}'
                    % (qj, p, tag.encode(), p, i, payload)
                )
                if len(batch) == spec["per_req"]:
                    yield b'{"items":[' + b",".join(batch) + b"]}"
                    batch = []
        if batch:
            yield b'{"items":[' + b",".join(batch) + b"]}"

    it = iter(bodies())
    pushed = 0
    errors: list[str] = []

    async def worker(conn: Conn) -> None:
        nonlocal pushed
        for body in it:
            for _attempt in range(20):
                try:
                    status, resp = await conn.request(raw_request("POST", "/api/v1/push", body))
                except HttpError as exc:
                    status, resp = 0, str(exc).encode()
                if status == 201:
                    pushed += body.count(b'"transactionId"')
                    break
                if status not in (0, 429, 503):
                    errors.append(f"fill {status}: {resp[:300]!r}")
                    return
                await asyncio.sleep(0.2)
            else:
                errors.append(f"fill kept failing: {resp[:300]!r}")
                return

    t0 = time.monotonic()
    conns = await connect_all(host, port, spec.get("concurrency", 4))
    await asyncio.gather(*(worker(c) for c in conns))
    for c in conns:
        c.close()
    return {"count": pushed, "elapsed_s": round(time.monotonic() - t0, 3), "errors": len(errors),
            "first_error": errors[0] if errors else None}  # fmt: skip


async def pop_latency_client(conn: Conn, spec: dict[str, Any], meter: Meter, deadline: float) -> None:
    path = f"/api/v1/pop/queue/{quote(spec['queue'], safe='')}?batch=1&wait=false&autoAck=true"
    pop_raw = raw_request("GET", path)
    while not meter.stop:
        got = await timed(conn, pop_raw, meter, time.perf_counter_ns(), 200, 1)
        if got is None:
            continue
        status, body = got
        if status in (429, 503):
            await backoff(meter, deadline)
        elif status != 200:  # 204 included: the queue ran dry, the figure would be an empty pop's
            meter.error(f"pop {status}: {body[:300]!r}")


async def run_pop_latency(spec: dict[str, Any], host: str, port: int) -> dict[str, Any]:
    meter = Meter()
    meter.latencies = []
    (conn,) = await connect_all(host, port, 1)
    deadline = time.monotonic() + spec["warmup"] + spec["duration"]
    out = await measured(spec, meter, [asyncio.create_task(pop_latency_client(conn, spec, meter, deadline))], None)
    if meter.latencies:
        out["latency_ms"] = latency_summary(meter.latencies)
    conn.close()
    return out


async def main_async(spec: dict[str, Any]) -> dict[str, Any]:
    url = urlsplit(spec["url"])
    host, port = url.hostname or "127.0.0.1", url.port or 80
    action = spec["action"]
    if action == "push":
        return await run_push(spec, host, port)
    if action == "latency":
        return await run_push({**spec, "clients": 1, "items": 1}, host, port)
    if action == "consume":
        return await run_consume(spec, host, port)
    if action == "fill":
        return await run_fill(spec, host, port)
    if action == "pop_latency":
        return await run_pop_latency(spec, host, port)
    raise SystemExit(f"unknown action {action!r}")


def run_spec(argv: list[str], entry: Callable[[dict[str, Any]], Coroutine[Any, Any, dict[str, Any]]]) -> int:
    """Run ``entry`` on the JSON spec in ``argv[1]`` (on uvloop when installed) and print its result."""
    spec = orjson.loads(argv[1])
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(entry(spec))
    else:
        result = uvloop.run(entry(spec))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


def main(argv: list[str]) -> int:
    return run_spec(argv, main_async)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
