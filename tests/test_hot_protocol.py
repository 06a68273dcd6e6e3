"""The data plane answered from the HTTP protocol (QUEEN_HOT_PROTOCOL=1, queen_pg/api/hot.py: HotPath) says
byte for byte what the ASGI app says (QUEEN_HOT_PROTOCOL=0): the same requests, written on real sockets to two
real brokers on two fresh databases, get the same status line, the same headers in the same order (``date``
aside) and the same body (ids and times aside), for every hot route's success (JSON and binary) and each
refusal: 400, 404, 405, 409, 413 (body, decoded), 415, 401/403 (JWT), 403 cross-site, 429, 503 maintenance,
500 with a request id, and the lame duck's ``connection: close``. The hot broker's counter proves the
protocol answered the hot requests; the other's that it answered none."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import jwt
import orjson
import pytest
import zstandard
from queen.http.push_binary import PushBatch, encode_push_frames

from queen_pg.api import ack as ack_route
from queen_pg.api.hot import HotPath
from tests.conftest import Broker, PgServer, broker_settings, fresh_database
from tests.helpers import eventually
from tests.test_e2e_binary import _frame, _frames_body

SECRET = "s3cret-for-tests-0123456789-abcdefghij"
ISS, AUD = "https://idp.test", "queen"
JWT_ON = {"jwt_enabled": True, "jwt_secret": SECRET, "jwt_issuer": ISS, "jwt_audience": AUD}
LIMITS = {"max_body_bytes": 64 * 1024, "admit_max_mb": 1, "admit_hold_ms": 50, "max_items": 100}
LEASE = "00000000-0000-4000-8000-000000000000"
PUSH_TYPE = "application/x-queen-push"

_VOLATILE = {"leaseId", "messageId", "id", "createdAt", "newExpiresAt", "expiresAt", "lease_expires_at",
             "transactionId", "partitionId", "request_id", "requestId", "updatedAt"}  # fmt: skip
REQUEST_ID = re.compile(r"request id [0-9a-f]{16}")


def _token(role: str) -> str:
    now = int(time.time())
    claims = {"sub": "svc", "iss": ISS, "aud": AUD, "iat": now, "exp": now + 300, "role": role}
    return jwt.encode(claims, SECRET, algorithm="HS256")


def request(method: str, path: str, body: bytes = b"", ctype: str | None = "application/json", **headers: str) -> bytes:
    """One HTTP/1.1 request, as a client writes it."""
    lines = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1"]
    if ctype is not None and (body or method == "POST"):
        lines.append(f"content-type: {ctype}")
    if body or method == "POST":
        lines.append(f"content-length: {len(body)}")
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def json_request(method: str, path: str, data: Any, **headers: str) -> bytes:
    return request(method, path, orjson.dumps(data), **headers)


async def read_answer(reader: asyncio.StreamReader) -> tuple[bytes, list[tuple[bytes, bytes]], bytes]:
    """One response off the wire: status line, headers in order, body (Content-Length framed)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status, *lines = head[:-4].split(b"\r\n")
    headers = [(n.strip().lower(), v.strip()) for n, _, v in (line.partition(b":") for line in lines)]
    length = next((int(v) for n, v in headers if n == b"content-length"), 0)
    return status, headers, await reader.readexactly(length)


def _stable(body: Any) -> Any:
    if isinstance(body, dict):
        return {k: ("*" if k in _VOLATILE and v else _stable(v)) for k, v in body.items()}
    if isinstance(body, list):
        return [_stable(v) for v in body]
    return REQUEST_ID.sub("request id *", body) if isinstance(body, str) else body


def normal(answer: tuple[bytes, list[tuple[bytes, bytes]], bytes]) -> tuple[Any, ...]:
    """The answer with what differs between two databases or two runs made equal: ``date``, ids and times in
    a JSON body (and then the Content-Length, checked against the body instead), a 429's random Retry-After."""
    status, headers, body = answer
    parsed: Any = body
    volatile = False
    if (b"content-type", b"application/json") in headers and body:
        raw = orjson.loads(body)
        parsed = _stable(raw)
        volatile = parsed != raw
    kept = []
    for name, value in headers:
        if name == b"date" or (name == b"retry-after" and status.startswith(b"HTTP/1.1 429")):
            value = b"*"
        elif name == b"content-length":
            assert int(value) == len(body)
            value = b"*" if volatile else value
        kept.append((name, value))
    return status, tuple(kept), parsed


class Wire:
    """One keep-alive connection to a broker."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, broker: Broker) -> Wire:
        reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
        return cls(reader, writer)

    async def ask(self, *requests: bytes) -> list[tuple[Any, ...]]:
        """Write the requests in one go (pipelined when several) and read their answers in order."""
        return [normal(a) for a in await self.ask_raw(*requests)]

    async def ask_raw(self, *requests: bytes) -> list[tuple[bytes, list[tuple[bytes, bytes]], bytes]]:
        self.writer.write(b"".join(requests))
        await self.writer.drain()
        return [await read_answer(self.reader) for _ in requests]

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


@contextlib.asynccontextmanager
async def pair(pg_server: PgServer, **overrides: Any) -> AsyncIterator[tuple[Broker, Broker]]:
    """A broker answering from the protocol and one answering through the app, each on a fresh database."""
    hot = Broker(broker_settings(fresh_database(pg_server), hot_protocol=True, **overrides))
    cold = Broker(broker_settings(fresh_database(pg_server), hot_protocol=False, **overrides))
    await hot.start()
    await cold.start()
    try:
        yield hot, cold
    finally:
        await hot.stop()
        await cold.stop()


def served(broker: Broker) -> int:
    hot: HotPath | None = broker.app.state.queen.transport.hot
    return 0 if hot is None else hot.served


async def _data_plane(broker: Broker) -> list[tuple[Any, ...]]:
    """Every hot route, succeeding and failing, on one keep-alive connection (some of it pipelined)."""
    out: list[tuple[Any, ...]] = []
    wire = await Wire.open(broker)
    conn = await asyncpg.connect(broker.settings.database_url)
    try:
        items = [{"queue": "h", "partition": "p", "payload": {"i": i}, "transactionId": f"t{i}"} for i in range(3)]
        out += await wire.ask(json_request("POST", "/api/v1/push", {"items": items}))  # 201
        out += await wire.ask(json_request("POST", "/api/v1/push", {"items": items[:1]}))  # 201, duplicate
        framed = encode_push_frames([PushBatch("b", "p", [b'{"a":1}', b"[2]"], ["x1", "x2"])])
        out += await wire.ask(request("POST", "/api/v1/push", framed, PUSH_TYPE))  # 201 binary
        out += await wire.ask(request("POST", "/api/v1/push", b"QPB\x01junk", PUSH_TYPE))  # 400 bad binary
        out += await wire.ask(request("POST", "/api/v1/push", b"{"))  # 400 bad JSON
        out += await wire.ask(json_request("POST", "/api/v1/push", {"items": []}))  # 400
        out += await wire.ask(request("GET", "/api/v1/push"))  # 405 (the app: another method)
        out += await wire.ask(request("POST", "/api/v1/ack/batch/x", b"{}"))  # 404 (the app)
        out += await wire.ask(request("POST", "/api/v1/push", b"<x/>", "text/xml"))  # 415
        out += await wire.ask(request("POST", "/api/v1/push", b"{}", sec_fetch_site="cross-site"))  # 403
        # a refusal before admission closes its connection (Connection: close): a new one goes on
        assert await wire.reader.read() == b""
        await wire.close()
        wire = await Wire.open(broker)
        bomb = zstandard.ZstdCompressor(level=19, write_content_size=True).compress(
            _frame(payload=b'"' + b"a" * (1 << 20) + b'"')
        )
        out += await wire.ask(request("POST", "/api/v1/push", _frames_body("h", "p", [_frame()], z=bomb), PUSH_TYPE))
        # 413 too_many_items: 101 items (QUEEN_MAX_ITEMS=100), JSON, binary, acks and a transaction
        many = [{"queue": "h", "payload": {"i": i}} for i in range(101)]
        out += await wire.ask(json_request("POST", "/api/v1/push", {"items": many}))
        framed = encode_push_frames([PushBatch("h", "p", [b"1"] * 101)])
        out += await wire.ask(request("POST", "/api/v1/push", framed, PUSH_TYPE))
        acks = [{"transactionId": "t", "partitionId": "1"}] * 101
        out += await wire.ask(json_request("POST", "/api/v1/ack/batch", {"acknowledgments": acks}))
        ops = [{"type": "push", "items": many[:50]}, {"type": "push", "items": many[50:]}]
        out += await wire.ask(json_request("POST", "/api/v1/transaction", {"operations": ops}))
        popped = await wire.ask_raw(request("GET", "/api/v1/pop/queue/h/partition/p?batch=2&consumerGroup=g"))
        out += [normal(a) for a in popped]
        lease = orjson.loads(popped[0][2])["leaseId"]
        out += await wire.ask(
            request("GET", "/api/v1/pop/queue/h?batch=x"),  # 400
            request("GET", "/api/v1/pop/queue/empty?wait=false"),  # 204
            request("GET", "/api/v1/pop?batch=1&consumerGroup=g2"),  # 400 or 200
            request("GET", "/api/v1/pop/queue/b?batch=5&consumerGroup=g"),  # 200 (binary pushed, JSON popped)
            request("GET", "/api/v1/nope"),  # 404 (the app) between hot ones
            request("POST", f"/api/v1/lease/{lease}/extend"),
            request("POST", f"/api/v1/lease/{LEASE}/extend"),  # unknown lease: 200 success false
        )  # pipelined: answered in order
        acks = [{"transactionId": f"t{i}", "partitionId": "1", "leaseId": LEASE} for i in range(2)]
        out += await wire.ask(
            json_request("POST", "/api/v1/ack/batch", {"consumerGroup": "g", "acknowledgments": acks})
        )
        ack = {"transactionId": "t2", "partitionId": "999", "consumerGroup": "g"}
        out += await wire.ask(json_request("POST", "/api/v1/ack", ack))
        out += await wire.ask(json_request("POST", "/api/v1/ack", {"transactionId": "t\u0000", "partitionId": "1"}))
        op = {"type": "ack", "transactionId": "t2", "partitionId": "1", "leaseId": LEASE, "consumerGroup": "g"}
        out += await wire.ask(json_request("POST", "/api/v1/transaction", {"operations": [op]}))  # a verdict
        pushing = {"type": "push", "items": [{"queue": "h2", "payload": 2}]}
        out += await wire.ask(json_request("POST", "/api/v1/transaction", {"operations": [pushing]}))
        # 409: a queue configured encrypted, on a broker without the key
        out += await wire.ask(json_request("POST", "/api/v1/configure", {"queue": "locked"}))
        await conn.execute("UPDATE queen.queues SET encryption_enabled = true WHERE name = 'locked'")
        out += await wire.ask(json_request("POST", "/api/v1/push", {"items": [{"queue": "locked", "payload": 1}]}))
        # 413 body_too_large: refused on its Content-Length, the connection closed
        big = request("POST", "/api/v1/push", b"x" * (65 * 1024))
        out += await wire.ask(big)
        await wire.close()
        wire = await Wire.open(broker)
        # 503 maintenance
        out += await wire.ask(json_request("POST", "/api/v1/system/maintenance", {"enabled": True}))
        out += await wire.ask(json_request("POST", "/api/v1/push", {"items": [{"queue": "m", "payload": 1}]}))
        out += await wire.ask(json_request("POST", "/api/v1/system/maintenance", {"enabled": False}))
        # the same counts under the same labels (route template, status)
        status, _, text = (await wire.ask_raw(request("GET", "/metrics")))[0]
        out.append(
            (status, (), sorted(x for x in text.decode().splitlines() if x.startswith("queen_http_requests_total{")))
        )
    finally:
        await conn.close()
    await wire.close()
    return out


async def _admission(broker: Broker) -> list[tuple[Any, ...]]:
    """429: 16 heads of 64 KiB bodies that do not come hold the whole 1 MiB budget; the next push waits,
    then is refused."""
    holders = [await Wire.open(broker) for _ in range(16)]
    head = request("POST", "/api/v1/push")[: -len(b"content-length: 0\r\n\r\n")] + b"content-length: 65536\r\n\r\n"
    for w in holders:
        w.writer.write(head)
        await w.writer.drain()
    budget = broker.app.state.queen.admission
    await eventually(lambda: budget.sem.used >= budget.capacity, "every head to hold its bytes")
    wire = await Wire.open(broker)
    out = await wire.ask(json_request("POST", "/api/v1/push", {"items": [{"queue": "a", "payload": 1}]}))
    for w in (*holders, wire):
        await w.close()
    return out


async def _internal(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """500: an exception no handler takes; then the lame duck's connection: close."""

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    wire = await Wire.open(broker)
    with monkeypatch.context() as m:
        m.setattr(ack_route, "request_once", broken)
        out = await wire.ask(json_request("POST", "/api/v1/ack", {"transactionId": "t", "partitionId": "1"}))
    broker.app.state.queen.transport.draining = True  # the lame duck (without its SIGTERM)
    out += await wire.ask(json_request("POST", "/api/v1/push", {"items": [{"queue": "d", "payload": 1}]}))
    broker.app.state.queen.transport.draining = False
    await wire.close()
    return out


async def _secured(broker: Broker) -> list[tuple[Any, ...]]:
    """Each request on a connection of its own: a refusal (401, 403) closes its connection."""
    push = orjson.dumps({"items": [{"queue": "j", "payload": 1}]})
    requests = (
        request("POST", "/api/v1/push", push),  # 401 missing token
        request("POST", "/api/v1/push", push, authorization="Bearer not.a.token"),  # 401 invalid
        request("POST", "/api/v1/push", push, authorization=f"Bearer {_token('read-only')}"),  # 403 level
        request("POST", "/api/v1/push", push, authorization=f"Bearer {_token('read-write')}"),  # 201
        request("GET", "/api/v1/pop/queue/j?wait=false", authorization=f"Bearer {_token('read-only')}"),  # 403
        request("GET", "/api/v1/pop/queue/j?wait=false", authorization=f"Bearer {_token('read-write')}"),  # 200
        request("POST", "/api/v1/ack", b"{}", authorization=f"Bearer {_token('read-only')}"),  # 403 level
    )
    out: list[tuple[Any, ...]] = []
    for one in requests:
        wire = await Wire.open(broker)
        out += await wire.ask(one)
        refused = out[-1][0].split(b" ")[1] in (b"401", b"403")
        assert refused == ((b"connection", b"close") in out[-1][1]), out[-1]
        if refused:
            assert await wire.reader.read() == b"", "a refused request's connection is closed"
        await wire.close()
    return out


async def test_the_protocol_answers_byte_for_byte_as_the_app(pg_server: PgServer) -> None:
    async with pair(pg_server, **LIMITS) as (hot, cold):
        with_hot = await _data_plane(hot)
        without = await _data_plane(cold)
        assert served(cold) == 0 and hot.app.state.queen.transport.hot is not None
        taken = served(hot)
    assert len(with_hot) == len(without)
    for mine, theirs in zip(with_hot, without, strict=True):
        assert mine == theirs, (set(mine[2]) ^ set(theirs[2])) if isinstance(mine[2], list) else None
    statuses = {int(s.split(b" ")[1]) for s, *_ in with_hot}
    assert {200, 201, 204, 400, 403, 404, 405, 409, 413, 415, 503} <= statuses, statuses
    codes = {b.get("code") for *_, b in with_hot if isinstance(b, dict)}
    assert {"bad_binary", "bad_json", "decoded_too_large", "body_too_large", "maintenance", "cross_site"} <= codes
    assert "too_many_items" in codes
    assert "encryption_key_missing" in codes and "unsupported_media_type" in codes
    assert any('route="/api/v1/lease/{lease_id}/extend",status="200"' in x for x in with_hot[-1][2])
    # every request above but the three the app answers (405, two 404s), the configure and maintenance calls,
    # /metrics
    assert taken == len(with_hot) - 3 - 1 - 2 - 1


async def test_the_protocol_refuses_as_the_app_with_jwt_on(pg_server: PgServer) -> None:
    async with pair(pg_server, **JWT_ON) as (hot, cold):
        with_hot, without = await _secured(hot), await _secured(cold)
        assert served(hot) == len(with_hot) and served(cold) == 0
    assert with_hot == without
    assert [int(s.split(b" ")[1]) for s, *_ in with_hot] == [401, 401, 403, 201, 403, 200, 403]
    assert any(n == b"www-authenticate" for n, _ in with_hot[0][1])


async def test_the_protocol_answers_429_500_and_the_lame_duck_as_the_app(
    pg_server: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with pair(pg_server, **LIMITS) as (hot, cold):
        with_hot = await _admission(hot) + await _internal(hot, monkeypatch)
        without = await _admission(cold) + await _internal(cold, monkeypatch)
        assert served(hot) >= len(with_hot) and served(cold) == 0
    assert with_hot == without
    assert [int(s.split(b" ")[1]) for s, *_ in with_hot] == [429, 500, 201]
    assert with_hot[1][2]["code"] == "internal" and with_hot[1][2]["requestId"] == "*"
    assert (b"connection", b"close") in with_hot[2][1]  # the lame duck closes after the answer
