"""Configure and the access levels: a read-write token configures queues, but weakening a guarantee of
an existing queue (encryption turned off, a shorter dedup window) needs the admin level. Real broker,
real HTTP, real tokens; the decision is the procedure's, against the stored options."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import Broker
from tests.test_security_jwt import JWT_ON, bearer, token

KEY = "11" * 32
STRONG = {"encryptionEnabled": True, "dedupWindowSeconds": 600, "leaseTime": 30}


@pytest.fixture
async def jwt_broker(start_broker: Any) -> Broker:
    b: Broker = await start_broker(**JWT_ON, encryption_key=KEY)
    return b


async def _configure(http: httpx.AsyncClient, queue: str, **options: Any) -> httpx.Response:
    return await http.post("/api/v1/configure", json={"queue": queue, "options": options})


async def _stored(http: httpx.AsyncClient, queue: str) -> dict[str, Any]:
    """What a configure writes: namespace, task, updatedAt and every option."""
    doc: dict[str, Any] = (await http.get(f"/api/v1/resources/queues/{queue}")).json()
    return {k: doc[k] for k in ("namespace", "task", "updatedAt", "config")}


async def _options(http: httpx.AsyncClient, queue: str) -> dict[str, Any]:
    """The queue's options as the broker reads them back."""
    r = await http.get(f"/api/v1/resources/queues/{queue}")
    assert r.status_code == 200, r.text
    opts: dict[str, Any] = r.json()["config"]
    return {k: opts[k] for k in ("encryptionEnabled", "dedupWindowSeconds", "leaseTime")}


@pytest.mark.parametrize(
    ("weakening", "says"),
    [
        pytest.param({"encryptionEnabled": False}, ["options.encryptionEnabled false"], id="encryption-off"),
        pytest.param({"dedupWindowSeconds": 0}, ["options.dedupWindowSeconds 0"], id="dedup-zero"),
        pytest.param({"dedupWindowSeconds": 599}, ["options.dedupWindowSeconds 599"], id="dedup-shorter"),
        pytest.param(
            {"leaseTime": 60, "encryptionEnabled": False, "dedupWindowSeconds": 1},
            ["options.encryptionEnabled false", "options.dedupWindowSeconds 1"],
            id="both-with-tuning",
        ),
    ],
)
async def test_read_write_cannot_weaken_a_queue_and_admin_can(
    jwt_broker: Broker, weakening: dict[str, Any], says: list[str]
) -> None:
    rw = httpx.AsyncClient(base_url=jwt_broker.url, headers=bearer(token("read-write")))
    admin = httpx.AsyncClient(base_url=jwt_broker.url, headers=bearer(token("admin")))
    async with rw, admin:
        assert (await _configure(rw, "wq", **STRONG)).status_code == 200  # a new queue: read-write may
        before = await _stored(rw, "wq")
        r = await rw.post("/api/v1/configure", json={"queue": "wq", "namespace": "moved", "options": weakening})
        assert r.status_code == 403, r.text
        assert r.json()["code"] == "forbidden"
        for part in [*says, "queue wq", "needs the admin level"]:
            assert part in r.json()["error"], r.json()["error"]
        assert await _options(rw, "wq") == STRONG  # nothing written, the tuning in the same body neither
        assert await _stored(rw, "wq") == before

        r = await _configure(admin, "wq", **weakening)
        assert r.status_code == 200, r.text
        assert await _options(rw, "wq") == {**STRONG, **weakening}


async def test_read_write_may_strengthen_tune_and_create_a_weak_queue(jwt_broker: Broker) -> None:
    async with httpx.AsyncClient(base_url=jwt_broker.url, headers=bearer(token("read-write"))) as rw:
        weak = {"encryptionEnabled": False, "dedupWindowSeconds": 0, "leaseTime": 30}
        assert (await _configure(rw, "new-weak", **weak)).status_code == 200  # nothing to weaken
        assert await _options(rw, "new-weak") == weak
        assert (await _configure(rw, "new-weak", dedupWindowSeconds=0, encryptionEnabled=False)).status_code == 200
        for stronger in ({"dedupWindowSeconds": 60}, {"encryptionEnabled": True}, {"dedupWindowSeconds": 60}):
            r = await _configure(rw, "new-weak", **stronger)
            assert r.status_code == 200, r.text
        assert (await _configure(rw, "new-weak", leaseTime=5)).status_code == 200  # tuning
        assert await _options(rw, "new-weak") == {"encryptionEnabled": True, "dedupWindowSeconds": 60, "leaseTime": 5}


async def test_without_jwt_configure_may_weaken(start_broker: Any) -> None:
    b: Broker = await start_broker(encryption_key=KEY)
    async with httpx.AsyncClient(base_url=b.url) as http:
        assert (await _configure(http, "open", **STRONG)).status_code == 200
        assert (await _configure(http, "open", encryptionEnabled=False, dedupWindowSeconds=0)).status_code == 200
        assert await _options(http, "open") == {"encryptionEnabled": False, "dedupWindowSeconds": 0, "leaseTime": 30}
