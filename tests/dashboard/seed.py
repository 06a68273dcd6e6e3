"""Real data for the dashboard tests, written through the public API with the official client.

``seed(url)`` runs the worker story of the seed (pop an order; one transaction: ack + KV put of the
order's new state + push to ``shipments`` + a timer one day later), then leaves something on every
page: a backlog in two partitions, a lagging group, two dead letters, trace events.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
from queen import Queen


@dataclass
class Seeded:
    order_id: str
    kv_key: str
    timer_key: str
    dead: list[dict[str, Any]]  # the dead letters' messages (as popped)


async def _ack(http: httpx.AsyncClient, m: dict[str, Any], status: str, group: str) -> None:
    body = {
        "transactionId": m["transactionId"],
        "partitionId": m["partitionId"],
        "leaseId": m["leaseId"],
        "status": status,
        "consumerGroup": group,
    }
    r = await http.post("/api/v1/ack", json=body)
    assert r.status_code == 200, r.text


async def fulfil_order(client: Queen) -> Any:
    """The seed's worker story: order o-1 of customer c-42 is pushed and popped by 'fulfillment'; one
    transaction acks it, records the order as paid in KV, pushes its shipment to the order's partition of
    ``shipments`` and schedules a review reminder 24 h later. Returns the transaction's answer."""
    await client.queue("orders").create()
    order = {"orderId": "o-1", "customer": "c-42"}
    await client.queue("orders").partition("c-42").push([{"data": order, "transactionId": "o-1"}])
    (m,) = await client.queue("orders").group("fulfillment").batch(1).wait(False).pop()
    res = await (
        client.transaction()
        .ack(m, "completed", {"consumer_group": "fulfillment"})
        .kv.put("orders", "order-o-1", {"status": "paid"}, ttl_seconds=7 * 86400)
        .queue("shipments")
        .partition(m["partition"])
        .push([{"transactionId": "ship-o-1", "data": {"orderId": "o-1"}}])
        .timer("reminders")
        .key("review-o-1")
        .payload(order)
        .after(timedelta(hours=24))
        .schedule()
        .commit()
    )
    assert res and res["success"] is True, res
    return res


async def seed(url: str, token: str | None = None) -> Seeded:
    """``token``: an admin bearer token when the broker has JWT on."""
    client_kw: dict[str, Any] = {"bearer_token": token} if token else {}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with Queen(url, **client_kw) as client, httpx.AsyncClient(base_url=url, timeout=30, headers=headers) as http:
        await fulfil_order(client)
        # a backlog: more orders in two partitions, not yet consumed by 'fulfillment'
        for p in ("c-42", "c-7"):
            await (
                client.queue("orders")
                .partition(p)
                .push([{"data": {"orderId": f"{p}-{i}", "customer": p}, "transactionId": f"{p}-{i}"} for i in range(3)])
            )
        # a second group that has read nothing: the lagging one
        await client.queue("orders").group("billing").subscription_mode("all").batch(1).wait(False).pop()
        # dead letters: 'payments' messages a worker gave up on
        r = await http.post(
            "/api/v1/push",
            json={
                "items": [
                    {
                        "queue": "payments",
                        "partition": "Default",
                        "transactionId": f"pay-{i}",
                        "payload": {"amount": 10 * i},
                    }
                    for i in (1, 2)
                ]
            },
        )
        assert r.status_code == 201, r.text
        r = await http.get(
            "/api/v1/pop/queue/payments", params={"batch": 2, "wait": "false", "consumerGroup": "ledger"}
        )
        dead = r.json()["messages"]
        for d in dead:
            await _ack(http, d, "dlq", "ledger")
        # trace events about the shipped order
        (ship,) = await client.queue("shipments").group("courier").batch(1).wait(False).pop()
        for name, text in (("order-o-1", "picked"), ("order-o-1", "packed")):
            r = await http.post(
                "/api/v1/traces",
                json={
                    "transactionId": ship["transactionId"],
                    "partitionId": ship["partitionId"],
                    "consumerGroup": "courier",
                    "traceNames": [name],
                    "eventType": "info",
                    "data": {"text": text},
                },
            )
            assert r.status_code in (200, 201), r.text
        return Seeded(order_id="o-1", kv_key="order-o-1", timer_key="review-o-1", dead=dead)


if __name__ == "__main__":  # seed a running broker by hand: python -m tests.dashboard.seed http://127.0.0.1:6632
    import asyncio
    import sys

    print(asyncio.run(seed(sys.argv[1])))
