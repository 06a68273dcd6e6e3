"""Drive a broker with the Queen 0.x client, queen-mq 0.15.0, through its own API, and print a JSON
summary of what the client saw on stdout (tests/test_e2e_client_015.py asserts it and the database).

Run with ``PYTHONPATH=.venv/queen-mq-0.15`` so ``import queen`` is 0.15.0, not the 2.6.0 client of
the venv (same package name). Usage: ``client015.py BROKER_URL work|delete|contract``.

* ``work``: configure four queues, push (with a duplicate transactionId), pop with a consumer group
  (no autopilot: 0.x always sends ``batch``), a lease renew, single and batch acks, a transaction
  (ack + push to another queue; 0.x puts the lease in ``requiredLeases`` only, never on the ack op),
  a transaction under a lease nobody holds (rolled back), failed acks until the DLQ, the DLQ
  listing, the 0.x consume loop, an ack of an unknown message.
* ``delete``: delete a queue, then look at it again through the client.
* ``contract``: docs/wire.md#contract through the 0.x API: a ``subscription_mode('from_beginning')`` consumer and a
  ``'new'`` one, ``admin.get_message`` (docs/wire.md#message-detail), ``admin.move_message_to_dlq`` and
  ``admin.clear_queue``
  (docs/wire.md#legacy-admin, whole queue and one partition).

Every request the client sends is recorded (``wire``) so the test can check the 0.x bodies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import queen
from queen import Queen

MODULE = str(Path(queen.__file__).resolve())  # the test checks it is the 0.15.0 directory
GROUP = "g015"
ORDERS = "orders015"  # the main queue; deleted in the `delete` phase
OUT = "out015"  # the transaction pushes here
FLAKY = "flaky015"  # retry_limit 1: a message failed twice goes to the DLQ
JOBS = "jobs015"  # read by the 0.x consume loop
FROM_START = "fb015"  # contract: subscription modes
ADMIN = "admin015"  # contract: get_message, move_message_to_dlq, clear_queue


def _brief(m: dict[str, Any]) -> dict[str, Any]:
    keys = ("transactionId", "partitionId", "partition", "leaseId", "consumerGroup", "data", "deliveryAttempt")
    return {k: m.get(k) for k in keys}


async def work(client: Queen) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["configure"] = [
        await client.queue(ORDERS).config({"lease_time": 30}).create(),
        await client.queue(OUT).create(),
        await client.queue(FLAKY).config({"retry_limit": 1}).create(),
        await client.queue(JOBS).create(),
    ]

    pushed = (
        await client.queue(ORDERS)
        .partition("p1")
        .push([{"data": {"n": i}, "transactionId": f"o-{i}"} for i in range(1, 5)])
    )
    out["push"] = [r.get("status") for r in pushed]
    dups: list[str] = []

    async def on_duplicate(items: list[dict[str, Any]], _err: Exception) -> None:
        dups.extend(it["transactionId"] for it in items)

    again = await (
        client.queue(ORDERS)
        .partition("p1")
        .push([{"data": {"n": 2}, "transactionId": "o-2"}])
        .on_duplicate(on_duplicate)
    )
    out["push_duplicate"] = {"status": [r.get("status") for r in again], "callback": dups}

    # pop (consumer group, no autopilot) and a single ack
    (m1,) = await client.queue(ORDERS).group(GROUP).batch(1).wait(False).pop()
    out["pop1"] = _brief(m1)
    renewed = await client.renew(m1)  # 0.x posts {} (no body) to /lease/{id}/extend
    out["renew"] = {"success": renewed.get("success"), "newExpiresAt": renewed.get("newExpiresAt")}
    out["ack_single"] = await client.ack(m1, True, {"group": GROUP})

    # a batch of two, acked with one batch call (0.x returns the broker's item list unchecked)
    batch = await client.queue(ORDERS).group(GROUP).batch(2).wait(False).pop()
    out["pop2"] = [_brief(m) for m in batch]
    out["ack_batch"] = await client.ack(batch, True, {"group": GROUP})

    # a transaction: ack o-4 and push its result to another queue; the ack op carries no leaseId
    (m4,) = await client.queue(ORDERS).group(GROUP).batch(1).wait(False).pop()
    out["pop3"] = _brief(m4)
    tx = (
        client.transaction()
        .ack(m4, "completed", {"consumer_group": GROUP})
        .queue(OUT)
        .partition("x")
        .push([{"data": {"from": m4["transactionId"]}}])
    )
    res = await tx.commit()
    out["tx"] = {"success": res.get("success"), "results": res.get("results")}
    out["pop_after_acks"] = await client.queue(ORDERS).group(GROUP).batch(10).wait(False).pop()

    # the transaction's push, popped in queue mode
    popped_out = await client.queue(OUT).batch(10).wait(False).pop()
    out["pop_out"] = [_brief(m) for m in popped_out]

    # a transaction under a lease nobody holds is rolled back whole (0.x: the lease is only in
    # requiredLeases): neither its ack of the out message nor its push happens
    stale = {**popped_out[0], "leaseId": str(uuid.uuid4())} if popped_out else {}
    try:
        await client.transaction().ack(stale).queue(OUT).partition("x").push([{"data": {"stale": True}}]).commit()
        out["tx_stale_lease"] = {"raised": None}
    except Exception as exc:  # the 0.x client raises Exception(error) on success:false
        out["tx_stale_lease"] = {"raised": str(exc)}

    # the real lease holder acks it (queue mode: no group)
    out["ack_out"] = await client.ack(popped_out, True) if popped_out else None
    out["pop_out_after_ack"] = await client.queue(OUT).batch(10).wait(False).pop()

    # failed acks until the message is dead-lettered (retry_limit 1: two deliveries)
    await client.queue(FLAKY).push([{"data": {"f": 1}, "transactionId": "f-1"}])
    attempts: list[Any] = []
    fails: list[dict[str, Any]] = []
    for _ in range(5):
        got = await client.queue(FLAKY).group(GROUP).batch(1).wait(False).pop()
        if not got:
            break
        attempts.append(got[0].get("deliveryAttempt"))
        fails.append(await client.ack(got[0], False, {"group": GROUP, "error": f"boom {len(attempts)}"}))
    out["flaky"] = {"attempts": attempts, "acks": fails}
    out["dlq"] = await client.queue(FLAKY).dlq(GROUP).limit(10).get()
    out["dlq_other_group"] = await client.queue(FLAKY).dlq("nobody").limit(10).get()

    # the 0.x consume loop: batches of 2, auto-ack after the handler, stop after 3 messages
    await client.queue(JOBS).push([{"data": {"j": i}, "transactionId": f"j-{i}"} for i in range(3)])
    handed: list[list[Any]] = []

    async def handler(messages: Any) -> None:
        batch = messages if isinstance(messages, list) else [messages]
        handed.append([m["data"]["j"] for m in batch])

    await client.queue(JOBS).group(GROUP).batch(2).limit(3).consume(handler)
    out["consume"] = handed

    # failure path: an ack of a message that does not exist
    out["ack_unknown"] = await client.ack(
        {"transactionId": "no-such", "partitionId": m1["partitionId"]}, True, {"group": GROUP}
    )
    return out


async def delete(client: Queen) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["get_before"] = (await client.admin.get_queue(ORDERS)).get("name")
    out["delete"] = await client.queue(ORDERS).delete()
    try:
        await client.admin.get_queue(ORDERS)
        out["get_after"] = None
    except Exception as exc:
        out["get_after"] = str(exc)
    out["pop_after_delete"] = await client.queue(ORDERS).group(GROUP).batch(1).wait(False).pop()
    out["delete_again"] = await client.queue(ORDERS).delete().on_error(_ignore)
    return out


async def contract(client: Queen) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # docs/wire.md#subscription: a from_beginning consumer reads the backlog; a `new` one skips it
    await client.queue(FROM_START).create()
    await client.queue(FROM_START).push([{"data": {"i": i}, "transactionId": f"fb-{i}"} for i in range(3)])
    seen: list[int] = []

    async def handler(messages: Any) -> None:
        for m in messages if isinstance(messages, list) else [messages]:
            seen.append(m["data"]["i"])

    await client.queue(FROM_START).group("fresh").subscription_mode("from_beginning").batch(2).limit(3).consume(handler)
    out["from_beginning"] = seen
    out["new_pop"] = await client.queue(FROM_START).group("tail").subscription_mode("new").batch(5).wait(False).pop()

    # docs/wire.md#message-detail and docs/wire.md#legacy-admin through the 0.x admin API
    await client.queue(ADMIN).partition("p1").push([{"data": {"n": i}, "transactionId": f"a-{i}"} for i in range(3)])
    await client.queue(ADMIN).partition("p2").push([{"data": {"n": 9}, "transactionId": "b-0"}])
    (m0,) = await client.queue(ADMIN).partition("p1").batch(1).wait(False).pop()
    await client.ack(m0, True)
    pid = m0["partitionId"]
    out["get_message"] = await client.admin.get_message(pid, "a-0")
    out["move_to_dlq"] = await client.admin.move_message_to_dlq(pid, "a-1")
    out["dlq"] = await client.queue(ADMIN).dlq().limit(10).get()
    out["pop_after_move"] = [
        m["transactionId"] for m in await client.queue(ADMIN).partition("p1").batch(10).wait(False).pop()
    ]
    out["clear_p2"] = await client.admin.clear_queue(ADMIN, "p2")
    await client.queue(ADMIN).partition("p1").push([{"data": {"n": 3}, "transactionId": "a-3"}])
    out["clear"] = await client.admin.clear_queue(ADMIN)
    out["pop_after_clear"] = await client.queue(ADMIN).batch(10).wait(False).pop()
    out["queue_after_clear"] = (await client.admin.get_queue(ADMIN)).get("name")
    return out


async def _ignore(_exc: Exception) -> None:
    return None


def record_wire(client: Queen, wire: list[dict[str, Any]]) -> None:
    """Every request the client sends: method, path, query and JSON body (an httpx event hook on the
    client's own httpx.AsyncClient), so the test can check what 0.x puts on the wire."""

    async def hook(request: httpx.Request) -> None:
        body = request.content
        wire.append(
            {
                "method": request.method,
                "path": request.url.path,
                "query": dict(request.url.params),
                "body": json.loads(body) if body else None,
            }
        )

    client._http_client._client.event_hooks["request"].append(hook)


async def main(url: str, phase: str) -> dict[str, Any]:
    summary: dict[str, Any] = {"version": queen.__version__, "module": MODULE, "wire": []}
    # retry_attempts=1: a 5xx from the broker shows up at once instead of being retried away
    client = Queen(url=url, retry_attempts=1)
    record_wire(client, summary["wire"])
    try:
        summary[phase] = await {"work": work, "delete": delete, "contract": contract}[phase](client)
    finally:
        await client.close()  # prints to stdout; main() runs with stdout sent to stderr
    return summary


if __name__ == "__main__":
    with contextlib.redirect_stdout(sys.stderr):  # the client prints ("Closing Queen client...", "Pop failed")
        result = asyncio.run(main(sys.argv[1], sys.argv[2]))
    print(json.dumps(result, default=str))
