"""End to end with the Queen 0.x client, queen-mq 0.15.0, against a real broker over HTTP.

0.15.0 is the same Python package (`queen`) as the 2.6.0 client of the venv, so it lives in its own
directory (`.venv/queen-mq-0.15`, installed by `make install`/`make test`) and runs in a subprocess
with that directory first on PYTHONPATH: tests/drivers/client015.py, which prints a JSON summary of
what the client saw. The broker runs in this test's event loop, so the driver is awaited with
asyncio.create_subprocess_exec. The tests assert the summary and the database state.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import asyncpg
import pytest

from tests.conftest import ROOT, Broker

CLIENT_DIR = (ROOT / ".venv" / "queen-mq-0.15").resolve()
DRIVER = ROOT / "tests" / "drivers" / "client015.py"
INSTALL = f"{sys.executable} -m pip install --no-deps --upgrade --target {CLIENT_DIR} queen-mq==0.15.0"


@pytest.fixture(autouse=True, scope="module")
def _client_installed() -> None:
    if not (CLIENT_DIR / "queen" / "__init__.py").exists():
        pytest.fail(f"queen-mq 0.15.0 is not installed in {CLIENT_DIR}; `make install` does it, or: {INSTALL}")


async def drive(broker: Broker, phase: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(CLIENT_DIR)}
    env.pop("QUEEN_CLIENT_LOG", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(DRIVER),
        broker.url,
        phase,
        env=env,
        cwd=str(ROOT),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(15):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"the 0.15.0 driver ({phase}) did not finish in 15 s") from None
    assert proc.returncode == 0, f"driver {phase} exited {proc.returncode}:\n{err.decode()}"
    summary: dict[str, Any] = json.loads(out)
    assert summary["version"] == "0.15.0", summary
    assert summary["module"].startswith(str(CLIENT_DIR)), summary["module"]
    summary["stderr"] = err.decode()
    return summary


def requests(wire: list[dict[str, Any]], method: str, prefix: str) -> list[dict[str, Any]]:
    return [r for r in wire if r["method"] == method and r["path"].startswith(prefix)]


async def cursor(conn: asyncpg.Connection, queue: str, group: str) -> list[tuple[str, int, Any]]:
    rows = await conn.fetch(
        """SELECT p.name, c.cursor_offset, c.lease_id FROM queen.log_consumers c
             JOIN queen.log_partitions p ON p.id = c.partition_id
             JOIN queen.queues q ON q.id = p.queue_id
            WHERE q.name = $1 AND c.consumer_group = $2 ORDER BY p.name""",
        queue,
        group,
    )
    return [(r["name"], r["cursor_offset"], r["lease_id"]) for r in rows]


async def test_client_015_push_pop_ack_transaction_dlq_and_delete(broker: Broker, conn: asyncpg.Connection) -> None:
    s = await drive(broker, "work")
    w, wire = s["work"], s["wire"]
    err = s["stderr"]
    assert "Pop failed" not in err and "DLQ query failed" not in err, err

    # configure: the 0.x body (all defaults, camelCase) is accepted
    orders, out, flaky, jobs = w["configure"]
    assert [c.get("success") for c in w["configure"]] == [True] * 4, w["configure"]
    assert orders["options"]["leaseTime"] == 30 and flaky["options"]["retryLimit"] == 1
    assert out["options"]["retryLimit"] == 3 and jobs["options"]["leaseTime"] == 300

    # push, and a duplicate transactionId reported as such (and through the on_duplicate callback)
    assert w["push"] == ["queued"] * 4
    assert w["push_duplicate"] == {"status": ["duplicate"], "callback": ["o-2"]}

    # pop with a consumer group: 0.x never sends autopilot, always a batch
    pops = requests(wire, "GET", "/api/v1/pop/")
    assert pops and all("autopilot" not in r["query"] and "batch" in r["query"] for r in pops), pops
    m1 = w["pop1"]
    assert (m1["transactionId"], m1["data"], m1["consumerGroup"], m1["deliveryAttempt"]) == ("o-1", {"n": 1}, "g015", 1)
    assert m1["partition"] == "p1" and m1["leaseId"]
    (extend,) = requests(wire, "POST", "/api/v1/lease/")
    assert extend["path"] == f"/api/v1/lease/{m1['leaseId']}/extend" and extend["body"] is None
    assert w["renew"]["success"] is True and w["renew"]["newExpiresAt"]
    assert w["ack_single"]["success"] is True and w["ack_single"]["transactionId"] == "o-1"

    # a batch of two and one batch ack (0.x does not look inside the items: the test does)
    assert [m["transactionId"] for m in w["pop2"]] == ["o-2", "o-3"]
    assert w["ack_batch"]["success"] is True
    assert [(r["transactionId"], r["success"]) for r in w["ack_batch"]["results"]] == [("o-2", True), ("o-3", True)]

    # the transaction: the ack op has no leaseId, the lease travels in requiredLeases only, and the
    # pushed item has no transactionId (0.x mints none); the broker acks o-4 and queues the push
    m4 = w["pop3"]
    assert m4["transactionId"] == "o-4"
    tx_ok, tx_stale = (r["body"] for r in requests(wire, "POST", "/api/v1/transaction"))
    ack_op, push_op = tx_ok["operations"]
    assert "leaseId" not in ack_op and ack_op["consumerGroup"] == "g015"
    assert tx_ok["requiredLeases"] == [m4["leaseId"]]
    assert "transactionId" not in push_op["items"][0]
    assert w["tx"]["success"] is True
    ack_res, push_res = w["tx"]["results"]
    assert ack_res["success"] is True and ack_res["transactionId"] == "o-4"
    assert push_res["status"] == "queued" and push_res["queue"] == "out015" and push_res["transactionId"]
    assert w["pop_after_acks"] == []

    # a transaction whose required lease is not held is refused whole: the client raises
    (mo,) = w["pop_out"]
    assert mo["data"] == {"from": "o-4"} and mo["partition"] == "x" and mo["consumerGroup"] is None
    assert "leaseId" not in tx_stale["operations"][0] and tx_stale["requiredLeases"] != [mo["leaseId"]]
    assert "not held" in (w["tx_stale_lease"]["raised"] or ""), w["tx_stale_lease"]
    # ... so the real lease holder's ack still succeeds, and nothing is left
    assert w["ack_out"]["success"] is True and w["ack_out"]["results"][0]["success"] is True
    assert w["pop_out_after_ack"] == []

    # failed acks until the DLQ (retry_limit 1: two deliveries), then the DLQ listing
    assert w["flaky"]["attempts"] == [1, 2]
    assert [(a["success"], a["dlq"]) for a in w["flaky"]["acks"]] == [(True, False), (True, True)]
    assert w["dlq"]["total"] == 1
    (dead,) = w["dlq"]["messages"]
    assert (dead["transactionId"], dead["data"], dead["consumerGroup"]) == ("f-1", {"f": 1}, "g015")
    assert dead["errorMessage"] == "boom 2" and dead["queue"] == "flaky015"
    assert w["dlq_other_group"]["total"] == 0 and w["dlq_other_group"]["messages"] == []

    # the 0.x consume loop: batches as asked, auto-acked, stops at the limit
    assert w["consume"] == [[0, 1], [2]]

    # an ack of an unknown message is refused (HTTP 200, success:false, docs/wire.md#ack-offset-commit rule 4)
    assert w["ack_unknown"]["success"] is False and "unresolvable" in w["ack_unknown"]["error"]

    # the database agrees
    parts = {
        r["name"]: (r["next_offset"], r["duplicates_total"])
        for r in await conn.fetch(
            """SELECT p.name, p.next_offset, p.duplicates_total FROM queen.log_partitions p
                 JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'orders015'"""
        )
    }
    assert parts == {"p1": (4, 1)}  # four messages, the duplicate not stored
    assert await cursor(conn, "orders015", "g015") == [("p1", 4, None)]  # all acked, lease released
    # out015 holds only the committed transaction's push (the refused one wrote nothing), acked
    assert (
        await conn.fetchval(
            "SELECT sum(p.next_offset) FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id"
            " WHERE q.name = 'out015'"
        )
        == 1
    )
    assert await cursor(conn, "out015", "__QUEUE_MODE__") == [("x", 1, None)]
    # (the payload column is filled later by a job; the listing above decoded it from the log)
    dlq = await conn.fetch("SELECT transaction_id, consumer_group, error, msg_offset, attempts FROM queen.log_dlq")
    assert [tuple(r) for r in dlq] == [("f-1", "g015", "boom 2", 0, 2)]
    assert await cursor(conn, "flaky015", "g015") == [("Default", 1, None)]  # moved past the dead letter
    assert await cursor(conn, "jobs015", "g015") == [("Default", 3, None)]

    # delete the queue through the client
    orders_id = await conn.fetchval("SELECT id FROM queen.queues WHERE name = 'orders015'")
    d = (await drive(broker, "delete"))["delete"]
    assert d["get_before"] == "orders015"
    assert d["delete"]["success"] is True and d["delete"]["deleted"] is True
    assert "not found" in (d["get_after"] or ""), d  # the admin GET now raises (404)
    assert d["pop_after_delete"] == []
    assert d["delete_again"]["deleted"] is False  # deleting twice is not an error
    assert await conn.fetchval("SELECT count(*) FROM queen.queues WHERE id = $1", orders_id) == 0
    assert await conn.fetchval("SELECT count(*) FROM queen.log_partitions WHERE queue_id = $1", orders_id) == 0
    assert await conn.fetchval("SELECT count(*) FROM queen.log_consumers WHERE queue_id = $1", orders_id) == 0
    names = await conn.fetch("SELECT name FROM queen.queues ORDER BY name")
    assert [r["name"] for r in names] == ["flaky015", "jobs015", "out015"]  # the others are untouched
    assert await conn.fetchval("SELECT count(*) FROM queen.log_dlq") == 1


async def test_client_015_subscription_modes_and_admin_calls(broker: Broker, conn: asyncpg.Connection) -> None:
    """docs/wire.md#subscription, #message-detail and #legacy-admin through the 0.x client's own API."""
    s = await drive(broker, "contract")
    c, wire = s["contract"], s["wire"]
    # docs/wire.md#subscription: from_beginning was a 400 that stopped consume(); now it reads the backlog in order
    assert c["from_beginning"] == [0, 1, 2]
    modes = [r["query"].get("subscriptionMode") for r in requests(wire, "GET", "/api/v1/pop/queue/fb015")]
    assert "from_beginning" in modes and "new" in modes
    assert c["new_pop"] == []
    # docs/wire.md#message-detail: the acked message, completed in queue mode
    g = c["get_message"]
    assert (g["transactionId"], g["status"], g["payload"], g["queue"], g["partition"]) == (
        "a-0",
        "completed",
        {"n": 0},
        "admin015",
        "p1",
    )
    assert g["consumerGroups"] == [{"name": "__QUEUE_MODE__", "consumed": True, "leaseExpiresAt": None}]
    # docs/wire.md#legacy-admin: move_message_to_dlq posts no body (its {} is dropped): queue mode; the DLQ lists it and
    # queue mode skips it
    (move,) = requests(wire, "POST", "/api/v1/messages/")
    assert move["path"].endswith("/a-1/dlq") and move["body"] is None
    assert (c["move_to_dlq"]["success"], c["move_to_dlq"]["status"], c["move_to_dlq"]["offset"]) == (True, "moved", 1)
    assert [(m["transactionId"], m["data"]) for m in c["dlq"]["messages"]] == [("a-1", {"n": 1})]
    assert c["pop_after_move"] == ["a-2"]
    # clear_queue: one partition, then all; the queue stays
    clears = requests(wire, "DELETE", "/api/v1/queues/admin015/clear")
    assert [r["query"] for r in clears] == [{"partition": "p2"}, {}]
    assert (c["clear_p2"]["partition"], c["clear_p2"]["messagesDropped"]) == ("p2", 1)
    assert (c["clear"]["partitions"], c["clear"]["messagesDropped"], c["clear"]["deadLettersDropped"]) == (
        2,
        4,
        1,
    )  # a-0..a-3 retained
    assert c["pop_after_clear"] == [] and c["queue_after_clear"] == "admin015"
    assert await conn.fetchval("SELECT count(*) FROM queen.log_segments s JOIN queen.log_partitions p "
                               "ON p.id = s.partition_id JOIN queen.queues q ON q.id = p.queue_id "
                               "WHERE q.name = 'admin015'") == 0  # fmt: skip
