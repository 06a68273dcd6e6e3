"""Chunked bodies (no Content-Length) are charged by admission for the bytes actually read: held open
they cannot buffer more than QUEEN_ADMIT_MAX_MB (16 large chunked pushes held open against a real
`queen-pg serve` process: its RSS stays under the budget + its baseline; those that cannot get more
permits within a second are refused 429 and the rest of their body is discarded), while a chunked push
within the limits still works and one beyond the body limit is 413."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from queen_pg.settings import MIB
from tests.conftest import Broker
from tests.helpers import eventually, until
from tests.serve_process import ServeProcess

CHUNKED_HEAD = (
    b"POST /api/v1/push HTTP/1.1\r\nhost: localhost\r\n"
    b"content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
)

JSON = {"content-type": "application/json"}


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def body(queue: str, payload_bytes: int) -> bytes:
    return b'{"items":[{"queue":"' + queue.encode() + b'","payload":"' + b"x" * payload_bytes + b'"}]}'


class HeldPush:
    """A chunked push whose body is sent as fast as the broker reads it and never finished."""

    def __init__(self, port: int, total: int, piece: int = 256 * 1024) -> None:
        self.port, self.total, self.piece = port, total, piece
        self.sent = 0
        self.task = asyncio.create_task(self._run())
        self.writer: asyncio.StreamWriter | None = None

    async def _run(self) -> None:
        _, writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer = writer
        writer.write(CHUNKED_HEAD + chunk(b'{"items":[{"queue":"held","payload":"'))
        data = chunk(b"x" * self.piece)
        while self.sent < self.total:
            writer.write(data)
            await writer.drain()  # blocks while the broker does not read: the bytes stay in the socket
            self.sent += self.piece

    async def close(self) -> None:
        self.task.cancel()
        if self.writer is not None:
            self.writer.close()


async def test_chunked_pushes_held_open_stay_within_the_admission_budget(db_url: str, tmp_path: Path) -> None:
    budget_mb, clients, each = 32, 16, 15 * MIB  # 240 MiB offered against a 32 MiB budget
    broker = ServeProcess(
        db_url,
        tmp_path / "broker.log",
        QUEEN_ADMIT_MAX_MB=str(budget_mb),
        QUEEN_MAX_BODY_BYTES=str(16 * MIB),
        QUEEN_ADMIT_HOLD_MS="60000",
    )
    await broker.start()
    held: list[HeldPush] = []
    try:
        async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
            r = await http.post("/api/v1/push", content=body("warm", 1000), headers=JSON)
            assert r.status_code == 201
            baseline = broker.rss_kib()
            held = [HeldPush(broker.port, each) for _ in range(clients)]
            peak, last_total, last_change = baseline, -1, time.monotonic()

            async def settled() -> bool:
                """Every sender finished (nothing held them back) or none progressed for a second."""
                nonlocal peak, last_total, last_change
                peak = max(peak, broker.rss_kib())
                total = sum(h.sent for h in held)
                if total != last_total:
                    last_total, last_change = total, time.monotonic()
                return all(h.task.done() for h in held) or time.monotonic() - last_change > 1.0

            await until(settled, "the held pushes to stall or finish", within=60)
            grown_mb = (peak - baseline) / 1024
            offered_mb = sum(h.sent for h in held) / MIB
            print(f"offered {offered_mb:.0f} MiB; RSS {baseline / 1024:.0f} MiB -> peak {peak / 1024:.0f} MiB")
            assert grown_mb < budget_mb + 16, f"RSS grew {grown_mb:.0f} MiB with a {budget_mb} MiB budget"

            for h in held:  # hang up: their permits come back
                await h.close()
            held = []

            async def admitted() -> bool:
                r = await http.post("/api/v1/push", content=body("after", 10), headers=JSON)
                return r.status_code == 201

            await until(admitted, "a push to be admitted once the held bodies are gone", within=30)
    finally:
        for h in held:
            await h.close()
        broker.kill()


async def test_a_chunked_push_is_charged_as_it_is_read_and_within_limits_works(
    start_broker: object, http: httpx.AsyncClient
) -> None:
    b: Broker = await start_broker(admit_max_mb=8, max_body_bytes=3 * MIB)  # type: ignore[operator]
    admission = b.app.state.queen.admission
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
    payload = 2 * MIB
    whole = body("chunky", payload)
    writer.write(CHUNKED_HEAD)
    for i in range(0, len(whole) - 10, 64 * 1024):
        writer.write(chunk(whole[i : min(i + 64 * 1024, len(whole) - 10)]))
    await writer.drain()
    # the broker has read ~2 MiB of a body announced with no length: it is charged for them (not 1 MiB)
    await eventually(lambda: admission.sem.used >= 2 * MIB, "admission to charge the bytes read")
    writer.write(chunk(whole[len(whole) - 10 :]) + b"0\r\n\r\n")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    writer.close()
    assert head.startswith(b"HTTP/1.1 201"), head
    await eventually(lambda: admission.sem.used == 0, "the permits to come back")


async def test_a_chunked_push_beyond_the_body_limit_is_413(start_broker: object) -> None:
    b: Broker = await start_broker(admit_max_mb=4, max_body_bytes=MIB)  # type: ignore[operator]
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
    writer.write(CHUNKED_HEAD)
    try:
        for _ in range(40):  # 2.5 MiB offered; the broker answers once it has read 1 MiB + 1
            writer.write(chunk(b"x" * 64 * 1024))
            await writer.drain()
    except ConnectionError:
        pass
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    writer.close()
    assert head.startswith(b"HTTP/1.1 413"), head
    await eventually(lambda: b.app.state.queen.admission.sem.used == 0, "the permits to come back")
