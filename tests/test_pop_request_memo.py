"""A pop's query is read once per distinct (path, query string, max_batch): repeated pops reuse the
parsed request, refused queries are never kept, and the map stays bounded."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from queen_pg.api import pop as routes_data
from tests.helpers import pop, push


async def _ack(http: httpx.AsyncClient, answer: Any) -> None:
    acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]}
            for m in answer["messages"]]  # fmt: skip
    r = await http.post("/api/v1/ack/batch", json={"acknowledgments": acks, "consumerGroup": "g"})
    assert r.status_code == 200 and all(x["success"] for x in r.json())


async def test_repeated_pops_reuse_the_parsed_request_and_refusals_are_not_kept(http: httpx.AsyncClient) -> None:
    routes_data._POP_REQUESTS.clear()
    await push(http, "memo", [{"payload": i} for i in range(10)])
    first = await pop(http, "memo", batch=2, consumerGroup="g")
    kept = dict(routes_data._POP_REQUESTS)
    assert len(kept) == 1
    (req,) = kept.values()
    assert (req.queue, req.batch, req.group, req.wait) == ("memo", 2, "g", False)
    await _ack(http, first)
    second = await pop(http, "memo", batch=2, consumerGroup="g")
    assert routes_data._POP_REQUESTS == kept  # the same request object, not read again
    assert [m["data"] for m in first["messages"]] == [0, 1]
    assert [m["data"] for m in second["messages"]] == [2, 3]
    await _ack(http, second)
    third = await pop(http, "memo", batch=3, consumerGroup="g")  # another query: read on its own
    assert [m["data"] for m in third["messages"]] == [4, 5, 6]
    for _ in range(2):  # refused every time, never kept
        r = await http.get("/api/v1/pop/queue/memo", params={"batch": "abc"})
        assert r.status_code == 400, r.text
        r = await http.get("/api/v1/pop/queue/memo", params={"batch": "0"})
        assert r.status_code == 400, r.text
    assert len(routes_data._POP_REQUESTS) == 2
    assert all(b"abc" not in k[2] and k[2] != b"batch=0" for k in routes_data._POP_REQUESTS)


async def test_the_kept_requests_are_bounded(http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    routes_data._POP_REQUESTS.clear()
    monkeypatch.setattr(routes_data, "POP_REQUESTS_KEPT", 2)
    await push(http, "memo", [{"payload": i} for i in range(3)])
    got: list[Any] = []
    for g in ("a", "b", "c"):
        got.append(await pop(http, "memo", consumerGroup=g))
        assert len(routes_data._POP_REQUESTS) <= 2
    assert [a["messages"][0]["data"] for a in got] == [0, 0, 0]  # each group from the start: each query read


async def test_max_batch_is_part_of_the_key(start_broker: Any) -> None:
    small = await start_broker(max_batch=2)
    large = await start_broker()
    routes_data._POP_REQUESTS.clear()
    async with httpx.AsyncClient(base_url=large.url) as h_large, httpx.AsyncClient(base_url=small.url) as h_small:
        await push(h_large, "memo", [{"payload": i} for i in range(10)])
        a = await pop(h_small, "memo", batch=5, consumerGroup="s")
        b = await pop(h_large, "memo", batch=5, consumerGroup="l")  # same path and query, other max_batch
    assert len(a["messages"]) == 2 and len(b["messages"]) == 5
