"""Encrypted queues: a sealed payload opens only in the (tenant, queue, partition) it was sealed for.

Format version 2 puts the place into the AES-GCM associated data (queen_pg/security/crypto.py), so
ciphertext that someone with SQL access copies into another tenant's, queue's or partition's rows is
a 409 ``encryption_key_unknown`` there (logged), never the plaintext. Version 1 (the first release:
only the head is associated data) is still opened wherever it is, as it always was.
"""

from __future__ import annotations

import base64
import logging
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import orjson
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from queen.http.pop_frames import decode_pop_frames

from queen_pg.db.pool import Database
from queen_pg.engine import codec
from queen_pg.engine import timers as timers_engine
from queen_pg.errors import QueenError
from queen_pg.security import crypto
from tests.conftest import Broker
from tests.test_encryption import K1, K2, SECRET_WORD, no_plaintext

A, B = "tenant-a", "tenant-b"


def seal_v1(key_hex: str, plaintext: bytes) -> bytes:
    """A payload as the first release sealed it (format version 1): the associated data is the six
    head bytes alone, so nothing names where the payload belongs."""
    key = bytes.fromhex(key_hex)
    head = bytes([crypto.MARK, crypto.VERSION_UNBOUND]) + crypto.key_id(key)
    nonce = os.urandom(crypto.NONCE_LEN)
    return head + nonce + AESGCM(key).encrypt(nonce, plaintext, head)


def test_a_sealed_payload_opens_only_in_its_place_and_version_1_anywhere() -> None:
    v = crypto.Vault(bytes.fromhex(K1))
    here = crypto.Place(A, "vault", "p1")
    sealed = v.seal(b'{"s":1}', here)
    assert sealed[1] == crypto.VERSION == 2
    assert v.open(sealed, crypto.Place(A, "vault", "p1")) == b'{"s":1}'
    for elsewhere in (
        crypto.Place(B, "vault", "p1"),
        crypto.Place(A, "other", "p1"),
        crypto.Place(A, "vault", "p2"),
        crypto.Place(A + "v", "ault", "p1"),  # the names are length-prefixed: no two places share bytes
    ):
        with pytest.raises(QueenError) as err:
            v.open(sealed, elsewhere)
        assert err.value.code == "encryption_key_unknown" and err.value.status == 409
        assert "sealed for another tenant, queue or partition" in str(err.value.fields["detail"])
    old = seal_v1(K1, b'{"s":2}')
    assert v.open(old, here) == v.open(old, crypto.Place(B, "x", "y")) == b'{"s":2}'
    with pytest.raises(QueenError, match="format version 9"):
        v.open(bytes([0, 9]) + old[2:], here)


async def test_version_1_payloads_still_open_in_every_reader(start_broker: Any, conn: asyncpg.Connection) -> None:
    """Segments and a timer written by the first release's sealing (version 1) read as before: pop
    (JSON and framed), browse, message detail and timer peek give the plaintext, under the old key too."""
    first: Broker = await start_broker(encryption_key=K1, jobs_enabled=False)
    async with httpx.AsyncClient(base_url=first.url) as http:
        r = await http.post("/api/v1/configure", json={"queue": "legacy", "options": {"encryptionEnabled": True}})
        assert r.status_code == 200, r.text
        items = [{"queue": "legacy", "payload": {"i": i, "s": "x"}, "transactionId": f"old-{i}"} for i in range(3)]
        assert (await http.post("/api/v1/push", json={"items": items})).status_code == 201
        op = {"op": "schedule", "queue": "legacy", "timerKey": "k", "delayMs": 3_600_000,
              "payload": base64.b64encode(b'{"t":"x"}').decode()}  # fmt: skip
        assert (await http.post("/api/v1/timers", json={"operations": [op]})).status_code == 200
    # the stored payloads rewritten as version 1 sealed them (same frames, same key)
    (seg,) = await conn.fetch("SELECT partition_id, base_offset, payload, codec FROM queen.log_segments")
    word = SECRET_WORD.encode()
    old = [
        codec.encode_frame(f.message_id, f.transaction_id, seal_v1(K1, b'{"i":%d,"s":"%s"}' % (i, word)),
                           f.trace_id, f.producer_sub, sealed=True)
        for i, f in enumerate(codec.unpack(seg["payload"], seg["codec"]))
    ]  # fmt: skip
    await conn.execute(
        "UPDATE queen.log_segments SET payload = $1, codec = 1 WHERE partition_id = $2 AND base_offset = $3",
        codec.pack(old), seg["partition_id"], seg["base_offset"],
    )  # fmt: skip
    await conn.execute("UPDATE queen.timers SET payload = $1", seal_v1(K1, b'{"t":"%s"}' % SECRET_WORD.encode()))
    stored = [f.payload[1] for r in await conn.fetch("SELECT payload, codec FROM queen.log_segments")
              for f in codec.unpack(r["payload"], r["codec"])]  # fmt: skip
    assert stored == [1, 1, 1]
    await no_plaintext(conn)
    await first.stop()

    rotated: Broker = await start_broker(encryption_key=K2, encryption_keys_old=K1, jobs_enabled=False)
    async with httpx.AsyncClient(base_url=rotated.url) as http:
        r = await http.get("/api/v1/messages", params={"queue": "legacy", "order": "asc"})
        assert r.status_code == 200, r.text
        assert [m["data"] for m in r.json()["messages"]] == [{"i": i, "s": SECRET_WORD} for i in range(3)]
        pid = r.json()["messages"][0]["partitionId"]
        r = await http.get(f"/api/v1/messages/{pid}/old-1")
        assert r.status_code == 200 and r.json()["data"] == {"i": 1, "s": SECRET_WORD}, r.text
        r = await http.get("/api/v1/timers/legacy/k")
        assert r.status_code == 200 and r.json()["data"] == {"t": SECRET_WORD}, r.text
        r = await http.get("/api/v1/pop/queue/legacy", params={"batch": 1, "consumerGroup": "json"})
        assert r.status_code == 200 and r.json()["messages"][0]["data"] == {"i": 0, "s": SECRET_WORD}, r.text
        r = await http.get("/api/v1/pop/queue/legacy", params={"batch": 3, "consumerGroup": "framed", "frames": "true"})
        assert r.status_code == 200, r.text
        got = [m["data"] for m in decode_pop_frames(r.content)["messages"]]
        assert got == [{"i": i, "s": SECRET_WORD} for i in range(3)]


async def pid_of(conn: asyncpg.Connection, tenant: str, queue: str, partition: str) -> int:
    pid: int = await conn.fetchval(
        "SELECT p.id FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id"
        " WHERE q.tenant = $1 AND q.name = $2 AND p.name = $3",
        tenant, queue, partition,
    )  # fmt: skip
    return pid


def as_tenant(broker: Broker, tenant: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=broker.url, headers={"x-queen-tenant": tenant}, timeout=30)


async def test_ciphertext_copied_into_another_place_with_sql_does_not_open_there(
    start_broker: Any, conn: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """Someone with SQL access copies tenant A's sealed segment over the segment of tenant B's
    partition of the same names, of another queue of A, and of another partition of A's queue, and
    A's sealed timer payload over B's timer. Every read there (JSON and framed pop, browse, timer
    peek) answers 409 ``encryption_key_unknown``, logged, with no byte of A's payload; the pop's lease
    goes back (the next pop meets the same 409, nothing is delivered). A still reads its own."""
    caplog.set_level(logging.WARNING, logger="queen_pg.crypto")
    b: Broker = await start_broker(encryption_key=K1, tenancy_header=True, jobs_enabled=False)
    source = (A, "vault", "p1")
    targets = [(B, "vault", "p1"), (A, "other", "p1"), (A, "vault", "p2")]
    timer = {"op": "schedule", "queue": "vault", "timerKey": "k", "partition": "p1", "delayMs": 3_600_000}
    for tenant, queue, part in [source, *targets]:
        data = {"s": SECRET_WORD} if (tenant, queue, part) == source else {"s": "decoy"}
        async with as_tenant(b, tenant) as http:
            r = await http.post("/api/v1/configure", json={"queue": queue, "options": {"encryptionEnabled": True}})
            assert r.status_code == 200, r.text
            item = {"queue": queue, "partition": part, "payload": data, "transactionId": "t"}
            assert (await http.post("/api/v1/push", json={"items": [item]})).status_code == 201
            if part == "p1" and queue == "vault":
                body = {"operations": [{**timer, "payload": base64.b64encode(orjson.dumps(data)).decode()}]}
                assert (await http.post("/api/v1/timers", json=body)).status_code == 200
    src = await conn.fetchrow(
        "SELECT payload, codec FROM queen.log_segments WHERE partition_id = $1", await pid_of(conn, *source)
    )
    for target in targets:
        done = await conn.execute(
            "UPDATE queen.log_segments SET payload = $1, codec = $2 WHERE partition_id = $3",
            src["payload"], src["codec"], await pid_of(conn, *target),
        )  # fmt: skip
        assert done == "UPDATE 1"
    done = await conn.execute(
        "UPDATE queen.timers SET payload = (SELECT payload FROM queen.timers WHERE tenant = $1) WHERE tenant = $2", A, B
    )
    assert done == "UPDATE 1"

    for tenant, queue, part in targets:
        async with as_tenant(b, tenant) as http:
            where = f"queue {queue!r} partition {part!r}"
            for params in ({"batch": 1}, {"batch": 1}, {"batch": 1, "frames": "true"}):  # twice: the lease went back
                r = await http.get(f"/api/v1/pop/queue/{queue}/partition/{part}", params=params)
                assert r.status_code == 409 and r.json()["code"] == "encryption_key_unknown", r.text
                assert where in r.json()["error"] and "another tenant, queue or partition" in r.json()["error"]
                assert SECRET_WORD not in r.text
            r = await http.get("/api/v1/messages", params={"queue": queue, "partition": part})
            assert r.status_code == 409 and r.json()["code"] == "encryption_key_unknown", r.text
            assert SECRET_WORD not in r.text
        assert any(tenant in m and where in m for m in caplog.messages), caplog.messages
    async with as_tenant(b, B) as http:
        r = await http.get("/api/v1/timers/vault/k")
        assert r.status_code == 409 and r.json()["code"] == "encryption_key_unknown", r.text
        assert SECRET_WORD not in r.text
    # the source reads as ever
    async with as_tenant(b, A) as http:
        r = await http.get("/api/v1/timers/vault/k")
        assert r.status_code == 200 and r.json()["data"] == {"s": SECRET_WORD}, r.text
        r = await http.get("/api/v1/pop/queue/vault/partition/p1", params={"batch": 1})
        assert r.status_code == 200 and r.json()["messages"][0]["data"] == {"s": SECRET_WORD}, r.text


async def test_every_path_that_keeps_a_payload_in_its_partition_still_opens_it(
    start_broker: Any, db: Database, conn: asyncpg.Connection
) -> None:
    """Sealed for the partition it lands in: a timer (POST /timers and a transaction's rider) into a
    named partition, fired and popped; a transaction push into a named partition; a dead letter
    listed, then requeued and popped again (it stays in its partition)."""
    b: Broker = await start_broker(encryption_key=K1, jobs_enabled=False)
    crypto.bind(db, crypto.Vault(bytes.fromhex(K1)))  # the fire below runs on the test's handle

    def b64(value: Any) -> str:
        return base64.b64encode(orjson.dumps(value)).decode()

    async with httpx.AsyncClient(base_url=b.url) as http:
        r = await http.post("/api/v1/configure", json={"queue": "kept", "options": {"encryptionEnabled": True}})
        assert r.status_code == 200, r.text
        op = {"op": "schedule", "queue": "kept", "timerKey": "k1", "partition": "p9", "delayMs": 0,
              "payload": b64({"via": "timer", "s": SECRET_WORD})}  # fmt: skip
        assert (await http.post("/api/v1/timers", json={"operations": [op]})).status_code == 200
        tx = {
            "operations": [{"type": "push", "items": [
                {"queue": "kept", "partition": "p8", "payload": {"via": "tx", "s": SECRET_WORD}, "transactionId": "d"}
            ]}],
            "timers": [{**op, "timerKey": "k2", "partition": "p7", "payload": b64({"via": "rider", "s": SECRET_WORD})}],
        }  # fmt: skip
        r = await http.post("/api/v1/transaction", json=tx)
        assert r.status_code == 200 and r.json()["success"], r.text
        fired = await timers_engine.fire(db, 10, datetime.now(UTC) + timedelta(seconds=1))
        assert fired.fired == 2
        await no_plaintext(conn)
        got = {}
        popped = {}
        for part in ("p9", "p8", "p7"):
            r = await http.get(f"/api/v1/pop/queue/kept/partition/{part}", params={"batch": 1})
            assert r.status_code == 200, r.text
            (popped[part],) = r.json()["messages"]
            got[part] = popped[part]["data"]
        assert got == {p: {"via": v, "s": SECRET_WORD} for p, v in (("p9", "timer"), ("p8", "tx"), ("p7", "rider"))}
        # the transaction's message dead-lettered, listed, requeued into its partition and popped again
        m = popped["p8"]
        ack = {"transactionId": "d", "partitionId": m["partitionId"], "leaseId": m["leaseId"], "status": "dlq"}
        r = await http.post("/api/v1/ack/batch", json={"acknowledgments": [{**ack, "error": "x"}]})
        assert r.status_code == 200 and r.json()[0]["dlq"], r.text
        dead = (await http.get("/api/v1/dlq", params={"queue": "kept"})).json()["messages"]
        assert [d["data"] for d in dead] == [{"via": "tx", "s": SECRET_WORD}]
        r = await http.post(f"/api/v1/messages/{m['partitionId']}/d/retry")
        assert r.status_code == 200 and r.json()["status"] == "requeued", r.text
        r = await http.get("/api/v1/pop/queue/kept/partition/p8", params={"batch": 1})
        assert r.status_code == 200 and r.json()["messages"][0]["data"] == {"via": "tx", "s": SECRET_WORD}, r.text
    await no_plaintext(conn)


async def test_seal_version_1_for_a_rolling_upgrade_writes_unbound_payloads(
    start_broker: Any, conn: asyncpg.Connection
) -> None:
    """QUEEN_ENCRYPTION_SEAL_VERSION=1 (brokers of an earlier release still pop): new payloads are
    version 1, which such a broker opens; the default writes version 2. Both brokers read both."""
    old_style: Broker = await start_broker(encryption_key=K1, encryption_seal_version=1, jobs_enabled=False)
    default: Broker = await start_broker(encryption_key=K1, jobs_enabled=False)
    for b, i in ((old_style, 0), (default, 1)):
        async with httpx.AsyncClient(base_url=b.url) as http:
            r = await http.post("/api/v1/configure", json={"queue": "roll", "options": {"encryptionEnabled": True}})
            assert r.status_code == 200, r.text
            item = {"queue": "roll", "payload": {"i": i, "s": SECRET_WORD}}
            assert (await http.post("/api/v1/push", json={"items": [item]})).status_code == 201
    rows = await conn.fetch("SELECT payload, codec FROM queen.log_segments ORDER BY base_offset")
    assert [f.payload[1] for r in rows for f in codec.unpack(r["payload"], r["codec"])] == [1, 2]
    await no_plaintext(conn)
    for b, group in ((old_style, "a"), (default, "b")):
        async with httpx.AsyncClient(base_url=b.url) as http:
            r = await http.get("/api/v1/pop/queue/roll", params={"batch": 2, "consumerGroup": group})
            assert r.status_code == 200, r.text
            assert [m["data"] for m in r.json()["messages"]] == [{"i": i, "s": SECRET_WORD} for i in range(2)]
