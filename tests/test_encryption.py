"""Encrypted queues: payloads sealed at rest with AES-256-GCM.

Every test reads the database raw (what psql sees) and asserts that no byte string of a known
payload is there, in the stored bytes or after undoing the zstd of a segment, in log_segments,
log_dlq and timers; and that the broker's readers (pop, message detail, browse, DLQ, timer peek) give
the plaintext back.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import stat
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
import pytest
from queen import Queen
from queen.http.pop_frames import decode_pop_frames

from queen_pg.db.pool import Database
from queen_pg.embedded_pg import EmbeddedPostgres
from queen_pg.engine import codec, sealing
from queen_pg.engine import timers as timers_engine
from queen_pg.errors import QueenError
from queen_pg.jobs.dlq_fill import DlqFill
from queen_pg.security import crypto
from queen_pg.settings import Settings
from tests.conftest import ROOT, Broker, free_port
from tests.helpers import until
from tests.serve_process import ServeProcess
from tests.test_security_jwt import JWT_ON, bearer, token

K1 = "11" * 32
K2 = "2f" * 32
SECRET_WORD = "attack-at-dawn-7f3c"  # the marker: must never appear in the database


async def raw_bytes(conn: asyncpg.Connection) -> list[bytes]:
    """Everything psql can read that may hold a payload, zstd undone where a segment is compressed."""
    out: list[bytes] = []
    for blob, codec_id in await conn.fetch("SELECT payload, codec FROM queen.log_segments"):
        out.append(bytes(blob))
        if codec_id == codec.CODEC_ZSTD:
            out.append(codec._decompressor.decompress(blob))
    for row in await conn.fetch("SELECT payload::text AS p, sealed FROM queen.log_dlq"):
        out.extend(bytes(v.encode() if isinstance(v, str) else v) for v in row.values() if v is not None)
    out.extend(bytes(r[0]) for r in await conn.fetch("SELECT payload FROM queen.timers"))
    return out


async def no_plaintext(conn: asyncpg.Connection, word: str = SECRET_WORD) -> None:
    needle = word.encode()
    for blob in await raw_bytes(conn):
        assert needle not in blob, "a plaintext payload is stored"


async def frames(conn: asyncpg.Connection, queue: str) -> list[codec.Frame]:
    rows = await conn.fetch(
        "SELECT s.payload, s.codec FROM queen.log_segments s JOIN queen.log_partitions p ON p.id = s.partition_id"
        " JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1 ORDER BY s.partition_id, s.base_offset",
        queue,
    )
    return [f for r in rows for f in codec.unpack(r["payload"], r["codec"])]


HERE = crypto.Place("default", "q", "Default")


def test_sealing_round_trip_key_ids_and_refusals() -> None:
    v = crypto.Vault(bytes.fromhex(K1))
    a, b = v.seal(b'{"x":1}', HERE), v.seal(b'{"x":1}', HERE)
    assert a != b  # a fresh nonce each time
    assert crypto.is_sealed(a) and a[1] == crypto.VERSION == 2 and a[2:6] == crypto.key_id(bytes.fromhex(K1))
    assert v.open(a, HERE) == b'{"x":1}'
    rotated = crypto.Vault(bytes.fromhex(K2), [bytes.fromhex(K1)])
    assert rotated.open(a, HERE) == b'{"x":1}'  # the old key still opens
    with pytest.raises(QueenError) as err:
        crypto.Vault(bytes.fromhex(K2)).open(a, HERE)
    assert err.value.code == "encryption_key_unknown" and err.value.status == 409
    tampered = a[:-1] + bytes([a[-1] ^ 1])
    with pytest.raises(QueenError, match="does not authenticate"):
        v.open(tampered, HERE)
    with pytest.raises(QueenError) as err:
        crypto.Vault().seal(b"1", HERE)
    assert err.value.code == "encryption_key_missing"
    assert K1 not in repr(v) and "set" in repr(v)


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"encryption_key": "abc"}, "QUEEN_ENCRYPTION_KEY must be 64 hex characters"),
        ({"encryption_key": "zz" * 32}, "not hex"),
        ({"encryption_key": K1, "encryption_keys_old": f"{K2},12"}, "QUEEN_ENCRYPTION_KEYS_OLD must be 64 hex"),
    ],
)
def test_a_malformed_key_refuses_to_start_without_printing_it(over: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError) as err:
        Settings(database_url="postgresql://x/y", **over)
    assert says in str(err.value)
    assert "zz" * 32 not in str(err.value) and K2 not in str(err.value)


async def secrets_round_trip(client: Queen, queue: str, n: int) -> None:
    """Push ``n`` messages carrying SECRET_WORD, pop them back as pushed, ack them."""
    data = [{"secret": f"{SECRET_WORD}-{i}", "n": i} for i in range(n)]
    pushed = await client.queue(queue).push([{"data": d} for d in data])
    assert [p["status"] for p in pushed] == ["queued"] * n
    got = await client.queue(queue).batch(10).wait(False).pop()
    assert [m["data"] for m in got] == data
    assert (await client.ack(got, True))["success"] is True


async def test_official_client_round_trip_and_psql_sees_only_ciphertext(
    start_broker: Any, conn: asyncpg.Connection
) -> None:
    b: Broker = await start_broker(encryption_key=K1, jobs_enabled=False)
    async with Queen(b.url) as client:
        created = await client.queue("vault").config({"encryption_enabled": True}).create()
        assert created["options"]["encryptionEnabled"] is True
        await secrets_round_trip(client, "vault", 5)
    await no_plaintext(conn)
    stored = await frames(conn, "vault")
    assert len(stored) == 5 and all(f.sealed for f in stored)
    assert all(crypto.is_sealed(f.payload) for f in stored)

    async with httpx.AsyncClient(base_url=b.url) as http:
        browse = (await http.get("/api/v1/messages", params={"queue": "vault"})).json()
        assert sorted(m["data"]["n"] for m in browse["messages"]) == list(range(5))
    # a plain queue beside it stays plain
    async with httpx.AsyncClient(base_url=b.url) as http:
        await http.post("/api/v1/push", json={"items": [{"queue": "open", "payload": {"w": "visible-word"}}]})
    assert any(b"visible-word" in blob for blob in await raw_bytes(conn))


async def test_client_015_encrypted_round_trip(start_broker: Any, conn: asyncpg.Connection) -> None:
    b: Broker = await start_broker(encryption_key=K1)
    client_dir = (ROOT / ".venv" / "queen-mq-0.15").resolve()
    script = f"""
import asyncio, json
from queen import Queen
async def main():
    async with Queen({b.url!r}) as c:
        cfg = await c.queue("v015").config({{"encryption_enabled": True}}).create()
        await c.queue("v015").push([{{"data": {{"s": "{SECRET_WORD}-015"}}}}])
        msgs = await c.queue("v015").batch(1).wait(False).pop()
        ack = await c.ack(msgs[0], True)
        print(json.dumps({{"cfg": cfg, "data": [m["data"] for m in msgs], "ack": ack}}))
asyncio.run(main())
"""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        env={**os.environ, "PYTHONPATH": str(client_dir)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    seen = json.loads(out.decode().splitlines()[0])  # the 0.x client prints its own lines after ours
    assert seen["cfg"]["options"]["encryptionEnabled"] is True
    assert seen["data"] == [{"s": f"{SECRET_WORD}-015"}]
    await no_plaintext(conn)
    assert all(f.sealed for f in await frames(conn, "v015"))


async def test_no_key_refuses_configure_push_and_pop_with_409(start_broker: Any, conn: asyncpg.Connection) -> None:
    plain: Broker = await start_broker()  # no QUEEN_ENCRYPTION_KEY
    async with httpx.AsyncClient(base_url=plain.url) as http:
        r = await http.post("/api/v1/configure", json={"queue": "nokey", "options": {"encryptionEnabled": True}})
        assert r.status_code == 409 and r.json()["code"] == "encryption_key_missing"
        why = r.json()["error"]  # says what to set, and why a `make run` broker does not need it
        assert "QUEEN_ENCRYPTION_KEY" in why and "embedded default" in why and "generates one" in why, why
    assert await conn.fetchval("SELECT count(*) FROM queen.queues") == 0  # nothing written

    keyed: Broker = await start_broker(encryption_key=K1)
    async with httpx.AsyncClient(base_url=keyed.url) as http:
        r = await http.post("/api/v1/configure", json={"queue": "locked", "options": {"encryptionEnabled": True}})
        assert r.status_code == 200
        r = await http.post("/api/v1/push", json={"items": [{"queue": "locked", "payload": {"s": SECRET_WORD}}]})
        assert r.status_code == 201
    before = await conn.fetchval("SELECT count(*) FROM queen.log_segments")
    async with httpx.AsyncClient(base_url=plain.url) as http:
        r = await http.post("/api/v1/push", json={"items": [{"queue": "locked", "payload": {"s": SECRET_WORD}}]})
        assert r.status_code == 409 and r.json()["code"] == "encryption_key_missing", r.text
        tx = {"operations": [{"type": "push", "items": [{"queue": "locked", "payload": {"s": SECRET_WORD}}]}]}
        r = await http.post("/api/v1/transaction", json=tx)
        assert r.status_code == 409 and r.json()["code"] == "encryption_key_missing", r.text
        # a pop that cannot open the payload: 409, and the lease goes back (nothing delivered, nothing lost)
        r = await http.get("/api/v1/pop/queue/locked", params={"batch": 1})
        assert r.status_code == 409 and r.json()["code"] == "encryption_key_unknown", r.text
        assert SECRET_WORD not in r.text
    assert await conn.fetchval("SELECT count(*) FROM queen.log_segments") == before
    async with httpx.AsyncClient(base_url=keyed.url) as http:
        r = await http.get("/api/v1/pop/queue/locked", params={"batch": 1})
        assert r.status_code == 200 and r.json()["messages"][0]["data"] == {"s": SECRET_WORD}
    await no_plaintext(conn)


async def test_rotation_keeps_old_messages_readable(start_broker: Any, db_url: str, conn: asyncpg.Connection) -> None:
    first: Broker = await start_broker(encryption_key=K1, jobs_enabled=False)
    async with httpx.AsyncClient(base_url=first.url) as http:
        await http.post("/api/v1/configure", json={"queue": "rot", "options": {"encryptionEnabled": True}})
        await http.post("/api/v1/push", json={"items": [{"queue": "rot", "payload": {"k": "old-" + SECRET_WORD}}]})
    await first.stop()
    rotated: Broker = await start_broker(encryption_key=K2, encryption_keys_old=K1, jobs_enabled=False)
    async with httpx.AsyncClient(base_url=rotated.url) as http:
        await http.post("/api/v1/push", json={"items": [{"queue": "rot", "payload": {"k": "new-" + SECRET_WORD}}]})
        got = (await http.get("/api/v1/pop/queue/rot", params={"batch": 10})).json()["messages"]
        assert [m["data"]["k"] for m in got] == ["old-" + SECRET_WORD, "new-" + SECRET_WORD]
    kids = [f.payload[2:6] for f in await frames(conn, "rot")]
    assert kids == [crypto.key_id(bytes.fromhex(K1)), crypto.key_id(bytes.fromhex(K2))]
    await no_plaintext(conn)
    # without the old key the old message is a clear 409, the new one is still readable through browse
    only_new: Broker = await start_broker(encryption_key=K2, jobs_enabled=False)
    async with httpx.AsyncClient(base_url=only_new.url) as http:
        r = await http.get("/api/v1/messages", params={"queue": "rot"})
        assert r.status_code == 409 and r.json()["code"] == "encryption_key_unknown"
        assert crypto.key_id(bytes.fromhex(K1)).hex() in r.json()["error"]


async def test_a_stale_cache_never_stores_plaintext(start_broker: Any, conn: asyncpg.Connection) -> None:
    """Broker B learned `flip` is plain; broker A (no mesh between them) turns encryption on while B
    pushes. B's pushes are refused by push_v1 under the partition lock until B seals: in every
    partition no plaintext frame follows a sealed one, and every frame after the switch is sealed."""
    a: Broker = await start_broker(encryption_key=K1, jobs_enabled=False)
    b: Broker = await start_broker(encryption_key=K1, jobs_enabled=False)
    async with httpx.AsyncClient(base_url=a.url) as ha, httpx.AsyncClient(base_url=b.url) as hb:
        await hb.post("/api/v1/push", json={"items": [{"queue": "flip", "payload": {"before": True}}]})
        assert not crypto.vault(b.app.state.queen.db).encrypted("default", "flip")

        first = asyncio.Event()

        async def pusher(n: int) -> None:
            for i in range(n):
                items = [{"queue": "flip", "partition": f"p{i % 3}", "payload": {"s": SECRET_WORD, "i": i}}]
                r = await hb.post("/api/v1/push", json={"items": items})
                assert r.status_code == 201, r.text
                first.set()

        task = asyncio.create_task(pusher(60))
        await first.wait()  # B is pushing when A switches encryption on
        r = await ha.post("/api/v1/configure", json={"queue": "flip", "options": {"encryptionEnabled": True}})
        assert r.status_code == 200
        switched = await conn.fetchval("SELECT clock_timestamp()")
        await task
        await pusher(3)  # surely after the switch
    assert crypto.vault(b.app.state.queen.db).encrypted("default", "flip")  # learned from the refusal
    rows = await conn.fetch(
        "SELECT s.partition_id, s.payload, s.codec, s.created_at FROM queen.log_segments s"
        " ORDER BY s.partition_id, s.base_offset"
    )
    seen_sealed: set[int] = set()
    for r in rows:
        for f in codec.unpack(r["payload"], r["codec"]):
            if f.sealed:
                seen_sealed.add(r["partition_id"])
            else:
                assert r["partition_id"] not in seen_sealed, "plaintext after ciphertext in one partition"
                assert r["created_at"] <= switched, "plaintext stored after encryption was switched on"
                assert b'"before"' in f.payload or SECRET_WORD.encode() in f.payload
    sealed_after = [f for r in rows if r["created_at"] > switched for f in codec.unpack(r["payload"], r["codec"])]
    assert len(sealed_after) >= 3 and all(f.sealed for f in sealed_after)


async def test_turning_encryption_off_stores_plaintext_again_and_old_ciphertext_stays_readable(
    start_broker: Any, conn: asyncpg.Connection
) -> None:
    a: Broker = await start_broker(encryption_key=K1, jobs_enabled=False)
    async with httpx.AsyncClient(base_url=a.url) as http:
        await http.post("/api/v1/configure", json={"queue": "off", "options": {"encryptionEnabled": True}})
        await http.post("/api/v1/push", json={"items": [{"queue": "off", "payload": 1}]})
        # another process turns it off: this broker's cache says encrypted, push_v1 says no, it stores plain
        await conn.execute("UPDATE queen.queues SET encryption_enabled = false WHERE name = 'off'")
        await http.post("/api/v1/push", json={"items": [{"queue": "off", "payload": 2}]})
        got = (await http.get("/api/v1/pop/queue/off", params={"batch": 10})).json()["messages"]
    assert [m["data"] for m in got] == [1, 2]
    assert [f.sealed for f in await frames(conn, "off")] == [True, False]


async def test_dlq_keeps_ciphertext_and_producer_sub_through_fill_and_requeue(
    start_broker: Any, db: Database, conn: asyncpg.Connection
) -> None:
    b: Broker = await start_broker(jobs_enabled=False, encryption_key=K1, **JWT_ON)
    crypto.bind(db, crypto.Vault(bytes.fromhex(K1)))
    async with httpx.AsyncClient(base_url=b.url, headers=bearer(token("admin", sub="dlq-svc"))) as http:
        await http.post("/api/v1/configure", json={"queue": "dq", "options": {"encryptionEnabled": True}})
        body = {"items": [{"queue": "dq", "payload": {"s": SECRET_WORD}, "transactionId": "t-1"}]}
        assert (await http.post("/api/v1/push", json=body)).status_code == 201
        m = (await http.get("/api/v1/pop/queue/dq", params={"batch": 1})).json()["messages"][0]
        ack = {"transactionId": "t-1", "partitionId": m["partitionId"], "leaseId": m["leaseId"], "status": "dlq"}
        assert (await http.post("/api/v1/ack/batch", json={"acknowledgments": [{**ack, "error": "x"}]})).json()[0][
            "dlq"
        ]
        before = (await http.get("/api/v1/dlq", params={"queue": "dq"})).json()["messages"]
        assert [(d["data"], d["producerSub"]) for d in before] == [({"s": SECRET_WORD}, "dlq-svc")]

        job = DlqFill()
        await job.run_once(db)  # hands out the row
        await job.run_once(db)  # writes it
        row = await conn.fetchrow("SELECT payload::text AS p, sealed, producer_sub FROM queen.log_dlq")
        assert row["p"] == "null" and crypto.is_sealed(bytes(row["sealed"])) and row["producer_sub"] == "dlq-svc"
        await conn.execute("DELETE FROM queen.log_segments")  # retention may drop it now: the copy must do
        after = (await http.get("/api/v1/dlq", params={"queue": "dq"})).json()["messages"]
        assert [(d["data"], d["producerSub"]) for d in after] == [({"s": SECRET_WORD}, "dlq-svc")]
        await no_plaintext(conn)

        r = await http.post(f"/api/v1/messages/{m['partitionId']}/t-1/retry")
        assert r.status_code == 200 and r.json()["status"] == "requeued", r.text
        (f,) = await frames(conn, "dq")
        assert f.sealed and f.producer_sub == "dlq-svc"
        again = (await http.get("/api/v1/pop/queue/dq", params={"batch": 1})).json()["messages"]
        assert [(x["data"], x["producerSub"]) for x in again] == [({"s": SECRET_WORD}, "dlq-svc")]
    await no_plaintext(conn)


async def test_dlq_fill_keeps_producer_sub_of_a_plain_queue(
    start_broker: Any, db: Database, conn: asyncpg.Connection
) -> None:
    """Regression (security.md "Remaining"): producerSub was null once dlq_fill copied the payload, and a
    requeue wrote the new frame without it."""
    b: Broker = await start_broker(jobs_enabled=False, **JWT_ON)
    async with httpx.AsyncClient(base_url=b.url, headers=bearer(token("admin", sub="plain-svc"))) as http:
        await http.post("/api/v1/push", json={"items": [{"queue": "pq", "payload": [1], "transactionId": "t"}]})
        m = (await http.get("/api/v1/pop/queue/pq", params={"batch": 1})).json()["messages"][0]
        ack = {"transactionId": "t", "partitionId": m["partitionId"], "leaseId": m["leaseId"], "status": "dlq"}
        await http.post("/api/v1/ack/batch", json={"acknowledgments": [ack]})
        job = DlqFill()
        await job.run_once(db)
        await job.run_once(db)
        assert await conn.fetchval("SELECT payload::text FROM queen.log_dlq") == "[1]"
        await conn.execute("DELETE FROM queen.log_segments")
        dead = (await http.get("/api/v1/dlq", params={"queue": "pq"})).json()["messages"]
        assert [(d["data"], d["producerSub"]) for d in dead] == [([1], "plain-svc")]
        assert (await http.post(f"/api/v1/messages/{m['partitionId']}/t/retry")).json()["status"] == "requeued"
        again = (await http.get("/api/v1/pop/queue/pq", params={"batch": 1})).json()["messages"]
        assert [(x["data"], x["producerSub"]) for x in again] == [([1], "plain-svc")]


async def test_transaction_push_into_an_encrypted_queue_is_sealed(start_broker: Any, conn: asyncpg.Connection) -> None:
    b: Broker = await start_broker(encryption_key=K1, jobs_enabled=False)
    async with httpx.AsyncClient(base_url=b.url) as http:
        await http.post("/api/v1/configure", json={"queue": "txq", "options": {"encryptionEnabled": True}})
        tx = {"operations": [{"type": "push", "items": [{"queue": "txq", "payload": {"s": SECRET_WORD}}]}]}
        r = await http.post("/api/v1/transaction", json=tx)
        assert r.status_code == 200 and r.json()["success"] is True, r.text
        got = (await http.get("/api/v1/pop/queue/txq", params={"batch": 1})).json()["messages"]
        assert got[0]["data"] == {"s": SECRET_WORD}
    assert [f.sealed for f in await frames(conn, "txq")] == [True]
    await no_plaintext(conn)


async def test_timers_of_an_encrypted_queue_stay_sealed_until_popped(
    start_broker: Any, db: Database, conn: asyncpg.Connection
) -> None:
    b: Broker = await start_broker(encryption_key=K1, jobs_enabled=False)
    async with httpx.AsyncClient(base_url=b.url) as http:
        await http.post("/api/v1/configure", json={"queue": "tq", "options": {"encryptionEnabled": True}})
        payload = base64.b64encode(orjson.dumps({"s": SECRET_WORD})).decode()
        op = {"op": "schedule", "queue": "tq", "timerKey": "k1", "payload": payload, "delayMs": 0, "txn": "tx-1"}
        r = await http.post("/api/v1/timers", json={"operations": [op]})
        assert r.status_code == 200 and r.json()["results"][0]["status"] == "scheduled", r.text
        stored = bytes(await conn.fetchval("SELECT payload FROM queen.timers"))
        assert crypto.is_sealed(stored)
        peek = (await http.get("/api/v1/timers/tq/k1")).json()
        assert peek["found"] and peek["encrypted"] is True and peek["data"] == {"s": SECRET_WORD}
        await no_plaintext(conn)
        fired = await timers_engine.fire(db, 10, datetime.now(UTC) + timedelta(seconds=1))
        assert fired.fired == 1
        (f,) = await frames(conn, "tq")
        assert f.sealed and f.transaction_id == "tx-1"
        got = (await http.get("/api/v1/pop/queue/tq", params={"batch": 1})).json()["messages"]
        assert got[0]["data"] == {"s": SECRET_WORD}
    await no_plaintext(conn)


async def test_a_timer_refused_by_the_sql_when_the_sealing_disagrees(db: Database, conn: asyncpg.Connection) -> None:
    await conn.execute("SELECT queen.configure_queue_v1('default', 'tz', NULL, NULL, '{\"encryptionEnabled\": true}')")
    op = {"op": "schedule", "queue": "tz", "timerKey": "k", "delayMs": 0, "txn": "x", "partition": "Default"}
    with pytest.raises(asyncpg.PostgresError) as err:
        await conn.fetchval(
            "SELECT queen.timers_v1('default', $1::text::jsonb, $2, $3, $4)",
            orjson.dumps([op]).decode(),
            [b'{"plain": 1}'],
            [codec.txn_hash("x")],
            [uuid.uuid4()],
        )
    assert err.value.args[0] == "encryption_mismatch" or "encryption_mismatch" in str(err.value)
    assert await conn.fetchval("SELECT count(*) FROM queen.timers") == 0
    # through the engine the broker learns it and seals
    crypto.bind(db, crypto.Vault(bytes.fromhex(K1)))
    res = await timers_engine.apply(db, "default", [op], [b'{"plain": 1}'], [codec.txn_hash("x")], [uuid.uuid4()])
    assert res[0]["status"] == "scheduled"
    assert crypto.is_sealed(bytes(await conn.fetchval("SELECT payload FROM queen.timers")))


async def test_the_dashboard_reads_decrypted_payloads_through_the_api(start_broker: Any) -> None:
    """The dashboard calls only the public API (messages, DLQ): those answers are decrypted."""
    b: Broker = await start_broker(encryption_key=K1, jobs_enabled=False)
    async with httpx.AsyncClient(base_url=b.url) as http:
        await http.post("/api/v1/configure", json={"queue": "dash", "options": {"encryptionEnabled": True}})
        await http.post("/api/v1/push", json={"items": [{"queue": "dash", "payload": {"s": SECRET_WORD}}]})

        async def listed() -> bool:
            r = await http.get("/api/v1/messages", params={"queue": "dash"})
            return r.status_code == 200 and r.json()["messages"][0]["data"] == {"s": SECRET_WORD}

        await until(listed, "the browse answer")


async def test_message_detail_is_decrypted(start_broker: Any) -> None:
    b: Broker = await start_broker(encryption_key=K1, jobs_enabled=False)
    async with httpx.AsyncClient(base_url=b.url) as http:
        await http.post("/api/v1/configure", json={"queue": "det", "options": {"encryptionEnabled": True}})
        body = {"items": [{"queue": "det", "payload": {"s": SECRET_WORD}, "transactionId": "d-1"}]}
        pid = (await http.post("/api/v1/push", json=body)).json()[0]["partitionId"]
        r = await http.get(f"/api/v1/messages/{pid}/d-1")
        assert r.status_code == 200, r.text
        detail = r.json()
        assert detail["data"] == detail["payload"] == {"s": SECRET_WORD} and detail["isEncrypted"] is True
        await http.post("/api/v1/push", json={"items": [{"queue": "clear", "payload": 1, "transactionId": "c"}]})
        pid = (await http.get("/api/v1/messages", params={"queue": "clear"})).json()["messages"][0]["partitionId"]
        assert (await http.get(f"/api/v1/messages/{pid}/c")).json()["isEncrypted"] is False


def test_a_framed_pop_blob_is_reframed_with_opened_payloads() -> None:
    v = crypto.Vault(bytes.fromhex(K1))
    mid, trace = uuid.uuid4(), uuid.uuid4()
    plain = codec.pack([codec.encode_frame(mid, "t", b'{"a":1}', trace, "sub")])
    assert sealing.opened_blob(v, plain, codec.CODEC_ZSTD, HERE) == (plain, codec.CODEC_ZSTD)
    sealed = codec.pack([codec.encode_frame(mid, "t", v.seal(b'{"a":1}', HERE), trace, "sub", sealed=True)])
    blob, codec_id = sealing.opened_blob(v, sealed, codec.CODEC_ZSTD, HERE)
    assert codec_id == codec.CODEC_RAW
    (f,) = codec.unpack(blob, codec_id)
    assert (f.payload, f.sealed, f.message_id, f.trace_id, f.producer_sub) == (b'{"a":1}', False, mid, trace, "sub")


async def test_a_peer_config_frame_drops_the_cached_answer(start_broker: Any) -> None:
    """The mesh's CONFIG handler (a peer configured a queue) also forgets the vault's answer for it."""
    b: Broker = await start_broker(encryption_key=K1, jobs_enabled=False, mesh_port=0)
    st = b.app.state.queen
    v = crypto.vault(st.db)
    v.learn("default", "q", True)
    assert st.mesh is not None
    st.mesh.on_config("default", "q")
    assert not v.encrypted("default", "q")


async def test_the_key_never_reaches_logs_answers_or_metrics(
    start_broker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    b: Broker = await start_broker(encryption_key=K1, encryption_keys_old=K2, jobs_enabled=False, log_level="debug")
    seen: list[str] = []
    async with httpx.AsyncClient(base_url=b.url) as http:
        await http.post("/api/v1/configure", json={"queue": "s", "options": {"encryptionEnabled": True}})
        await http.post("/api/v1/push", json={"items": [{"queue": "s", "payload": 1}]})
        seen.append((await http.get("/api/v1/pop/queue/s")).text)
        seen.append((await http.get("/metrics")).text)
        seen.append((await http.get("/api/v1/resources/queues/s")).text)
    plain: Broker = await start_broker(jobs_enabled=False)
    async with httpx.AsyncClient(base_url=plain.url) as http:
        seen.append((await http.get("/api/v1/messages", params={"queue": "s"})).text)  # a 409
    assert "encryption_key_unknown" in seen[-1]
    everything = caplog.text + "".join(seen) + repr(b.settings) + str(b.settings.model_dump().keys())
    for secret in (K1, K2, bytes.fromhex(K1).decode("latin-1")):
        assert secret not in everything


async def test_binary_client_round_trip_into_an_encrypted_queue(start_broker: Any, conn: asyncpg.Connection) -> None:
    """The official client with every binary option: a framed push into an encrypted queue is sealed
    (this broker's cache does not know the queue yet: push_v1 refuses the plain blob, the broker
    learns and packs the messages sealed), and a framed pop ships the opened payloads."""
    a: Broker = await start_broker(encryption_key=K1, jobs_enabled=False)
    b: Broker = await start_broker(encryption_key=K1, jobs_enabled=False)
    async with httpx.AsyncClient(base_url=a.url) as http:  # configured through another broker
        r = await http.post("/api/v1/configure", json={"queue": "bvault", "options": {"encryptionEnabled": True}})
        assert r.status_code == 200, r.text
    assert not crypto.vault(b.app.state.queen.db).encrypted("default", "bvault")
    async with Queen(b.url, binary_push=True, push_compression=True, framed_pop=True) as client:
        await secrets_round_trip(client, "bvault", 4)
    await no_plaintext(conn)
    stored = await frames(conn, "bvault")
    assert len(stored) == 4 and all(f.sealed for f in stored)


def count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every segment a framed pop decodes to look for sealed frames (``sealing.opened_blob``), by its
    frame count: the brokers of a test run in this process."""
    seen: list[int] = []
    real = sealing.opened_blob

    def counting(v: crypto.Vault, blob: bytes, codec_id: int, place: crypto.Place) -> tuple[bytes, int]:
        seen.append(len(list(codec.unpack(blob, codec_id))))
        return real(v, blob, codec_id, place)

    monkeypatch.setattr(sealing, "opened_blob", counting)
    return seen


async def framed_pop(http: httpx.AsyncClient, queue: str, batch: int = 10, auto_ack: bool = False) -> list[Any]:
    """A framed pop's messages as the official client decodes them (it refuses a sealed frame)."""
    params = {"batch": batch, "frames": "true", "autoAck": str(auto_ack).lower()}
    r = await http.get(f"/api/v1/pop/queue/{queue}", params=params)
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-queen-pop", r.text
    return [m["data"] for m in decode_pop_frames(r.content)["messages"]]


async def stored_sealed(conn: asyncpg.Connection, queue: str) -> list[bool | None]:
    return [
        r[0]
        for r in await conn.fetch(
            "SELECT s.sealed FROM queen.log_segments s JOIN queen.log_partitions p ON p.id = s.partition_id"
            " JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1 ORDER BY s.partition_id, s.base_offset",
            queue,
        )
    ]


async def test_a_framed_pop_decodes_only_segments_that_may_hold_sealed_frames(
    start_broker: Any, conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker holding a key (the embedded default) ships a never-encrypted queue's segments as they
    are stored, without decoding them, and still opens an encrypted queue's."""
    b: Broker = await start_broker(encryption_key=K1, jobs_enabled=False)
    decoded = count_decodes(monkeypatch)
    data = [{"n": i, "s": SECRET_WORD} for i in range(3)]
    async with httpx.AsyncClient(base_url=b.url) as http:
        r = await http.post("/api/v1/configure", json={"queue": "enc", "options": {"encryptionEnabled": True}})
        assert r.status_code == 200, r.text
        for q in ("plain", "enc"):
            r = await http.post("/api/v1/push", json={"items": [{"queue": q, "payload": d} for d in data]})
            assert r.status_code == 201, r.text
        assert await framed_pop(http, "plain") == data
        assert decoded == []
        assert await framed_pop(http, "enc") == data
        assert decoded == [3]
    assert await stored_sealed(conn, "plain") == [False]
    assert await stored_sealed(conn, "enc") == [True]


async def test_a_queue_switched_off_and_on_again_pops_everything_opened(
    start_broker: Any, conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Encrypted, then plain, then encrypted again: one framed pop gets all messages opened, having
    decoded only the two sealed segments; a lease that cuts a segment too."""
    b: Broker = await start_broker(encryption_key=K1, jobs_enabled=False)
    decoded = count_decodes(monkeypatch)
    async with httpx.AsyncClient(base_url=b.url) as http:
        for n, on in enumerate((True, False, True)):
            r = await http.post("/api/v1/configure", json={"queue": "flip", "options": {"encryptionEnabled": on}})
            assert r.status_code == 200 and r.json()["options"]["encryptionEnabled"] is on, r.text
            items = [{"queue": "flip", "payload": [n, k]} for k in range(2)]
            assert (await http.post("/api/v1/push", json={"items": items})).status_code == 201
        assert await stored_sealed(conn, "flip") == [True, False, True]
        assert await framed_pop(http, "flip", batch=3, auto_ack=True) == [[0, 0], [0, 1], [1, 0]]
        assert decoded == [2]
        assert await framed_pop(http, "flip", batch=10) == [[1, 1], [2, 0], [2, 1]]
        assert decoded == [2, 2]


def postmaster_environ(data_dir: Path) -> bytes:
    postmaster = int((data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])
    return Path(f"/proc/{postmaster}/environ").read_bytes()


async def _stop(serve: ServeProcess) -> None:
    serve.terminate()
    assert await asyncio.to_thread(serve.process.wait, 60) == 0, serve.log()


async def test_the_embedded_default_generates_a_key_once_and_keeps_it(tmp_path: Path) -> None:
    """`queen-pg serve` with no DATABASE_URL and no key (`make run`): encrypted queues work; the key
    is generated once into <data_dir>/encryption_key (0600), reaches every worker, survives a
    restart, and stays readable as an old key once an operator configures one of their own."""
    data = tmp_path / "data"
    pg_port = free_port()
    env = {"QUEEN_DATA_DIR": str(data), "QUEEN_PG_PORT": str(pg_port), "QUEEN_APPLY_SCHEMA": "1",
           "QUEEN_ENCRYPTION_KEY": "", "QUEEN_ENCRYPTION_KEYS_OLD": ""}  # fmt: skip
    serve = ServeProcess("", tmp_path / "serve.log", **env)
    secrets = [{"s": f"{SECRET_WORD}-{i}"} for i in range(3)]
    await serve.start()
    try:
        async with Queen(serve.url) as client:
            created = await client.queue("vault").config({"encryption_enabled": True}).create()
            assert created["options"]["encryptionEnabled"] is True
            await client.queue("vault").push([{"data": d} for d in secrets])
            got = await client.queue("vault").batch(1).wait(False).pop()
            assert [m["data"] for m in got] == secrets[:1]
            assert (await client.ack(got, True))["success"] is True
        key_file = data / "encryption_key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        key = key_file.read_text().strip()
        assert len(bytes.fromhex(key)) == 32
        conn = await asyncpg.connect(EmbeddedPostgres(data, port=pg_port).dsn())
        try:
            await no_plaintext(conn)
            stored = await frames(conn, "vault")
            assert len(stored) == 3 and all(crypto.is_sealed(f.payload) for f in stored)
            assert {f.payload[2:6] for f in stored} == {crypto.key_id(bytes.fromhex(key))}
        finally:
            await conn.close()
    finally:
        await _stop(serve)

    serve.env["QUEEN_WORKERS"] = "2"  # the key reaches every worker through the environment
    await serve.start()
    try:
        async with Queen(serve.url) as client:
            got = await client.queue("vault").batch(1).wait(False).pop()
            assert [m["data"] for m in got] == secrets[1:2]  # pushed before the restart: the key persisted
            assert (await client.ack(got, True))["success"] is True
        for i in range(6):  # one connection each: both workers answer some
            async with httpx.AsyncClient(base_url=serve.url) as http:
                r = await http.post("/api/v1/push", json={"items": [{"queue": "vault", "payload": {"w": i}}]})
                assert r.status_code == 201, r.text
    finally:
        await _stop(serve)
    assert (data / "encryption_key").read_text().strip() == key

    serve.env.update(QUEEN_WORKERS="1", QUEEN_ENCRYPTION_KEY=K1)  # an operator's key wins
    await serve.start()
    try:
        async with Queen(serve.url) as client:
            got = await client.queue("vault").batch(10).wait(False).pop()
            assert [m["data"] for m in got] == [secrets[2], *({"w": i} for i in range(6))]  # the file's key opens
            await client.queue("vault").push([{"data": {"s": SECRET_WORD}}])
        conn = await asyncpg.connect(EmbeddedPostgres(data, port=pg_port).dsn())
        try:
            assert (await frames(conn, "vault"))[-1].payload[2:6] == crypto.key_id(bytes.fromhex(K1))
        finally:
            await conn.close()
        environ = postmaster_environ(data)  # what the account PostgreSQL runs as can read
        assert K1.encode() not in environ and key.encode() not in environ
    finally:
        await _stop(serve)
    assert (data / "encryption_key").read_text().strip() == key  # kept, never replaced


def test_a_configured_key_never_creates_the_key_file(tmp_path: Path) -> None:
    assert crypto.embedded_keys(K1, "", tmp_path) == (K1, "")
    assert not (tmp_path / "encryption_key").exists()
    generated, old = crypto.embedded_keys("", K2, tmp_path)
    assert old == K2 and stat.S_IMODE((tmp_path / "encryption_key").stat().st_mode) == 0o600
    assert crypto.embedded_keys("", K2, tmp_path) == (generated, K2)  # once
    assert crypto.embedded_keys(K1, K2, tmp_path) == (K1, f"{K2},{generated}")  # the file's key stays readable
    (tmp_path / "encryption_key").chmod(0o644)
    assert crypto.embedded_keys("", "", tmp_path) == (generated, "")
    assert stat.S_IMODE((tmp_path / "encryption_key").stat().st_mode) == 0o600  # set back
    (tmp_path / "encryption_key").write_text("not-a-key\n")
    with pytest.raises(ValueError, match="encryption_key must be 64 hex characters"):
        crypto.embedded_keys("", "", tmp_path)
    (tmp_path / "encryption_key").unlink()
    (tmp_path / "encryption_key").symlink_to(tmp_path / "elsewhere")  # planted: never followed
    with pytest.raises(ValueError, match="must be a regular file"):
        crypto.embedded_keys("", "", tmp_path)
    assert not (tmp_path / "elsewhere").exists()
