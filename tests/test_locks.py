"""Locks and semaphores (docs/wire.md#locks) against a real PostgreSQL: acquire/renew/release/get through the
engine with time passed in (p_now), the permit as a KV row and its guard, the 400s, and end to end with
the official client queen-mq 2.6.0."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from queen import Queen
from queen.errors import LockError

from queen_pg.api.kv.ops import validate_kv_ops, validate_lock_ops
from queen_pg.db.pool import Database
from queen_pg.engine import kv as kv_engine
from queen_pg.engine import locks as locks_engine
from queen_pg.errors import QueenError, Verdict
from tests.conftest import Broker

T0 = datetime(2030, 1, 1, tzinfo=UTC)
S = timedelta(seconds=1)
US = timedelta(microseconds=1)


async def run(db: Database, *ops: dict[str, Any], now: datetime = T0) -> list[dict[str, Any]]:
    out = await locks_engine.apply(db, "default", validate_lock_ops(list(ops)), now)
    results: list[dict[str, Any]] = out["results"]
    assert [r["index"] for r in results] == list(range(len(ops)))
    return results


async def op(db: Database, now: datetime = T0, **fields: Any) -> dict[str, Any]:
    return (await run(db, fields, now=now))[0]


def acquire(owner: str, name: str = "job", ttl: int = 10, **more: Any) -> dict[str, Any]:
    return {"op": "acquire", "name": name, "ttlSeconds": ttl, "owner": owner, **more}


async def kv(db: Database, *ops: dict[str, Any], now: datetime = T0) -> list[dict[str, Any]]:
    out = await kv_engine.apply(db, "default", validate_kv_ops(list(ops), in_transaction=False), now)
    results: list[dict[str, Any]] = out["results"]
    return results


def iso(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def test_acquire_is_a_kv_row_whose_version_is_the_token(db: Database) -> None:
    won = await op(db, **acquire("a"))
    token = won["token"]
    guard = {"op": "check", "ns": "queen-locks", "key": "job#0", "expect": token, "required": True}
    assert won == {
        "index": 0,
        "op": "acquire",
        "name": "job",
        "acquired": True,
        "slot": 0,
        "token": token,
        "owner": "a",
        "guard": guard,
        "expiresAt": iso(T0 + 10 * S),
    }
    row = (await kv(db, {"op": "get", "ns": "queen-locks", "key": "job#0"}))[0]
    assert (row["version"], row["value"]["owner"], row["expiresAt"]) == (token, "a", iso(T0 + 10 * S))
    assert row["value"]["since"] == row["value"]["renewedAt"] == iso(T0)
    assert (await kv(db, guard))[0]["applied"] is True

    held = await op(db, **acquire("b"))
    assert (held["acquired"], held["reason"]) == (False, "held")
    assert held["holders"] == [
        {"slot": 0, "owner": "a", "token": token, "since": iso(T0), "expiresAt": iso(T0 + 10 * S), "renewedAt": iso(T0)}
    ]
    again = await op(db, T0 + S, **acquire("a", ttl=99))  # the holder resending: same permit, untouched
    assert (again["acquired"], again["already"], again["token"], again["slot"]) == (True, True, token, 0)
    assert (again["guard"], again["expiresAt"]) == (guard, iso(T0 + 10 * S))

    got = await op(db, op="get", name="job")
    assert (got["held"], [h["owner"] for h in got["holders"]]) == (True, ["a"])
    assert await op(db, op="get", name="other") == {
        "index": 0,
        "op": "get",
        "name": "other",
        "held": False,
        "holders": [],
    }


async def test_renew_gives_a_newer_token_also_for_the_owners_old_token(db: Database) -> None:
    t1 = (await op(db, **acquire("a")))["token"]
    r1 = await op(db, T0 + 3 * S, op="renew", name="job", token=t1, ttlSeconds=10, slot=0, owner="a")
    t2 = r1["token"]
    assert (r1["renewed"], r1["slot"], r1["owner"], r1["expiresAt"]) == (True, 0, "a", iso(T0 + 13 * S))
    assert t2 > t1 and r1["guard"]["expect"] == t2
    # the same owner resending the old token (its answer was lost) still renews
    r2 = await op(db, T0 + 4 * S, op="renew", name="job", token=t1, ttlSeconds=10, slot=0, owner="a")
    assert r2["renewed"] is True and r2["token"] > t2
    # the old token alone, or someone else, is lost
    lost = await op(db, T0 + 4 * S, op="renew", name="job", token=t1, ttlSeconds=10, slot=0)
    assert (lost["renewed"], lost["reason"], [h["token"] for h in lost["holders"]]) == (False, "lost", [r2["token"]])
    other = await op(db, T0 + 4 * S, op="renew", name="job", token=t1, ttlSeconds=10, slot=0, owner="b")
    assert other["reason"] == "lost"
    # renewedAt moves, since stays
    row = (await kv(db, {"op": "get", "ns": "queen-locks", "key": "job#0"}))[0]
    assert (row["value"]["since"], row["value"]["renewedAt"], row["version"]) == (iso(T0), iso(T0 + 4 * S), r2["token"])
    # the guard of an old token no longer checks
    with pytest.raises(Verdict) as caught:
        await kv(db, {"op": "check", "ns": "queen-locks", "key": "job#0", "expect": t2, "required": True})
    assert caught.value.detail["kvReason"] == "version" and caught.value.detail["value"]["owner"] == "a"


async def test_release_needs_the_current_token(db: Database) -> None:
    t1 = (await op(db, **acquire("a")))["token"]
    wrong = await op(db, op="release", name="job", token=t1 + 1, slot=0)
    assert (wrong["released"], wrong["reason"]) == (False, "lost")
    assert (await op(db, op="release", name="job", token=t1, slot=0))["released"] is True
    assert (await op(db, op="get", name="job"))["held"] is False
    assert (await op(db, op="release", name="job", token=t1, slot=0))["reason"] == "lost"
    assert (await op(db, **acquire("b")))["token"] > t1


async def test_renew_and_release_without_slot_find_the_permit(db: Database) -> None:
    a, b = await run(db, acquire("a", limit=2), acquire("b", limit=2))
    assert (a["slot"], b["slot"]) == (0, 1)
    by_token = await op(db, op="renew", name="job", token=b["token"], ttlSeconds=10)
    assert (by_token["renewed"], by_token["slot"], by_token["owner"]) == (True, 1, "b")
    by_owner = await op(db, op="renew", name="job", token=1, ttlSeconds=10, owner="a")
    assert (by_owner["renewed"], by_owner["slot"]) == (True, 0)
    assert (await op(db, op="renew", name="job", token=1, ttlSeconds=10))["reason"] == "lost"
    released = await op(db, op="release", name="job", token=by_token["token"])
    assert (released["released"], released["slot"]) == (True, 1)
    assert (await op(db, op="release", name="job", token=by_token["token"]))["released"] is False


async def test_semaphore_of_three_the_fourth_is_contended(db: Database) -> None:
    got = await run(db, *(acquire(f"o{i}", limit=3) for i in range(3)))
    assert [(r["acquired"], r["slot"]) for r in got] == [(True, 0), (True, 1), (True, 2)]
    assert [r["guard"]["key"] for r in got] == ["job#0", "job#1", "job#2"]
    fourth = await op(db, **acquire("o3", limit=3))
    assert (fourth["acquired"], fourth["reason"]) == (False, "contended")
    assert [(h["slot"], h["owner"]) for h in fourth["holders"]] == [(0, "o0"), (1, "o1"), (2, "o2")]
    assert (await op(db, op="release", name="job", token=got[1]["token"], slot=1))["released"] is True
    assert (await op(db, **acquire("o3", limit=3)))["slot"] == 1
    # a limit of 1 on the same name sees slot 0 taken: held
    assert (await op(db, **acquire("o4")))["reason"] == "held"


async def test_expiry_edge_another_owner_takes_it_and_the_old_token_stops_checking(db: Database) -> None:
    old = await op(db, **acquire("a", ttl=10))
    at = T0 + 10 * S
    assert (await op(db, at - US, **acquire("b")))["reason"] == "held"
    assert (await kv(db, old["guard"], now=at - US))[0]["applied"] is True
    # at expiresAt the permit is gone: the guard reads absent, the holder's renew is lost
    check = (await kv(db, {**old["guard"], "required": False}, now=at))[0]
    assert (check["applied"], check["reason"]) == (False, "absent")
    assert (await op(db, at, op="get", name="job"))["held"] is False
    lost = await op(db, at, op="renew", name="job", token=old["token"], ttlSeconds=10, slot=0, owner="a")
    assert lost["reason"] == "lost"
    new = await op(db, at, **acquire("b"))
    assert (new["acquired"], new["slot"], new["owner"]) == (True, 0, "b") and new["token"] > old["token"]
    with pytest.raises(Verdict) as caught:
        await kv(db, old["guard"], now=at)
    assert caught.value.detail == {
        "failedIndex": 0,
        "kvReason": "version",
        "version": new["token"],
        "value": {"owner": "b", "since": iso(at), "renewedAt": iso(at)},
    }
    assert (await op(db, at, op="release", name="job", token=old["token"], slot=0))["reason"] == "lost"


async def test_concurrent_acquires_have_one_winner_and_a_semaphore_of_1024_works(db: Database) -> None:
    results = await asyncio.gather(*(op(db, **acquire(f"o{i}", name="race")) for i in range(10)))
    assert sum(r["acquired"] for r in results) == 1
    results = await asyncio.gather(*(op(db, **acquire(f"o{i}", name="sem", limit=4)) for i in range(8)))
    assert sorted(r["slot"] for r in results if r["acquired"]) == [0, 1, 2, 3]
    big = await op(db, **acquire("x", name="wide", limit=1024))
    assert (big["acquired"], big["slot"]) == (True, 0)


async def test_an_acquire_without_owner_gets_a_minted_one(db: Database) -> None:
    won = await op(db, op="acquire", name="anon", ttlSeconds=5)
    assert won["acquired"] is True and won["owner"].startswith("anonymous:")


BAD: list[tuple[Any, str, str]] = [
    ({"op": "acquire"}, "bad_field", "operations: must be a list"),
    ([{"op": "take", "name": "n"}], "unknown_op", "operations[0].op"),
    ([{"op": "get", "name": "n", "owner": "x"}], "unknown_field", "operations[0].owner"),
    ([{"op": "get"}], "missing_field", "operations[0].name"),
    ([{"op": "get", "name": ""}], "bad_field", "name"),
    ([{"op": "get", "name": "a#1"}], "bad_field", "'#'"),
    ([{"op": "get", "name": "a\nb"}], "bad_field", "control characters"),
    ([{"op": "get", "name": "n" * 257}], "too_long", "257 bytes; the limit is 256"),
    ([{"op": "acquire", "name": "n"}], "missing_field", "ttlSeconds"),
    ([{"op": "acquire", "name": "n", "ttlSeconds": 0}], "bad_field", "ttlSeconds"),
    ([{"op": "acquire", "name": "n", "ttlSeconds": True}], "bad_field", "ttlSeconds"),
    ([{"op": "acquire", "name": "n", "ttlSeconds": 5, "limit": 0}], "bad_field", "limit"),
    ([{"op": "acquire", "name": "n", "ttlSeconds": 5, "limit": 1025}], "bad_field", "limit"),
    ([{"op": "acquire", "name": "n", "ttlSeconds": 5, "owner": ""}], "bad_field", "owner"),
    ([{"op": "acquire", "name": "n", "ttlSeconds": 5, "owner": "o" * 257}], "too_long", "owner"),
    ([{"op": "renew", "name": "n", "ttlSeconds": 5}], "missing_field", "token"),
    ([{"op": "renew", "name": "n", "ttlSeconds": 5, "token": 0}], "bad_field", "token"),
    ([{"op": "release", "name": "n", "token": 3, "slot": -1}], "bad_field", "slot"),
    ([{"op": "release", "name": "n", "token": 3, "ttlSeconds": 5}], "unknown_field", "ttlSeconds"),
    (
        [{"op": "acquire", "name": f"n{i}", "ttlSeconds": 5, "limit": 600} for i in range(2)],
        "too_many_slots",
        "operations[1].limit",
    ),
    ([{"op": "get", "name": "n"}] * 65, "too_many_ops", "the limit is 64"),
]


@pytest.mark.parametrize(("ops", "reason", "message"), BAD, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD)])
def test_validation_refuses_with_index_field_and_reason(ops: Any, reason: str, message: str) -> None:
    with pytest.raises(QueenError) as caught:
        validate_lock_ops(ops)
    assert (caught.value.code, caught.value.status, caught.value.fields["reason"]) == ("locks_bad_request", 400, reason)
    assert message in str(caught.value)


async def test_http_locks_shapes(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    body = {"operations": [acquire("a"), {"op": "get", "name": "job"}]}
    r = await http.post("/api/v1/locks", json=body)
    assert r.status_code == 200
    won, got = r.json()["results"]
    assert won["acquired"] is True and got["held"] is True
    r = await http.post("/api/v1/locks", json={"operations": [{"op": "get", "name": "a#b"}]})
    assert r.status_code == 400
    err = r.json()
    assert (err["error"], err["code"], err["reason"]) == ("locks_bad_request", "locks_bad_request", "bad_field")
    assert "operations[0].name" in err["detail"]
    r = await http.post("/api/v1/locks", content=b"{bad", headers={"content-type": "application/json"})
    assert (r.status_code, r.json()["reason"]) == (400, "bad_json")
    # the permit's row: readable and checkable through /kv, never writable there
    r = await http.post(
        "/api/v1/kv",
        json={"operations": [{"op": "check", "ns": "queen-locks", "key": "job#0", "expect": won["token"]}]},
    )
    assert r.json()["results"][0]["applied"] is True
    r = await http.post("/api/v1/kv", json={"operations": [{"op": "delete", "ns": "queen-locks", "key": "job#0"}]})
    assert (r.status_code, r.json()["reason"]) == (400, "reserved_namespace")
    assert await conn.fetchval("SELECT count(*) FROM queen.kv WHERE ns = 'queen-locks'") == 1


async def test_official_client_lock_semaphore_and_guard(broker: Broker) -> None:
    async with Queen(broker.url) as one, Queen(broker.url) as two:
        lock = one.lock("report", ttl_seconds=30)
        assert await lock.acquire() is True
        token = lock.token
        assert isinstance(token, int) and lock.slot == 0
        row = await one.kv.get("queen-locks", "report#0")
        assert row["version"] == token and row["value"]["owner"] == lock.owner
        rival = two.lock("report", ttl_seconds=30)
        assert await rival.acquire() is False
        info = await two.locks.get("report")
        assert info and [h["owner"] for h in info["holders"]] == [lock.owner]

        # the guard in a KV batch: holds now; after a renew the old token's guard is lost
        guard = lock.guard()
        put = await one.kv.batch([guard, one.kv.op.put("reports", "daily", {"ok": 1}, forever=True)])
        assert [bool(r) for r in put] == [True, True]
        assert await lock.renew() is True
        assert lock.token is not None and lock.token > token
        assert await one.kv.batch([guard, one.kv.op.put("reports", "daily", {"ok": 2}, forever=True)]) == []
        assert (await one.kv.get("reports", "daily"))["value"] == {"ok": 1}

        assert await lock.release() is True
        assert await rival.acquire() is True
        await rival.release()

        permits = [one.semaphore("pool", 3, ttl_seconds=30) for _ in range(3)]
        assert [await p.acquire() for p in permits] == [True, True, True]
        assert sorted(p.slot for p in permits if p.slot is not None) == [0, 1, 2]
        assert await two.semaphore("pool", 3, ttl_seconds=30).acquire() is False
        async with two.semaphore("other", 2, ttl_seconds=30) as held:
            assert held.held

        with pytest.raises(LockError) as refused:
            await one.locks.batch([{"op": "get", "name": "x", "bogus": 1}])
        assert (refused.value.status, refused.value.code, refused.value.reason) == (
            400,
            "locks_bad_request",
            "unknown_field",
        )
