"""KV (docs/wire.md#kv) against a real PostgreSQL: every op and reason at its edges through the engine with
time passed in (p_now), the 400s of the validator, the HTTP shapes, the expired-row sweep, and end to end
with the official client queen-mq 2.6.0."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from queen import Queen
from queen.errors import KvError

from queen_pg.api.kv.ops import validate_kv_ops
from queen_pg.db import locks
from queen_pg.db.pool import Database
from queen_pg.engine import kv as kv_engine
from queen_pg.errors import QueenError, Verdict
from queen_pg.jobs.kv_sweep import KvSweep
from tests.conftest import Broker

T0 = datetime(2030, 1, 1, tzinfo=UTC)
S = timedelta(seconds=1)
US = timedelta(microseconds=1)


async def batch(db: Database, ops: list[dict[str, Any]], now: datetime = T0) -> list[dict[str, Any]]:
    """Validate like the route, run at ``now``, and return the results without index/op/ns/key."""
    out = await kv_engine.apply(db, "default", validate_kv_ops(ops, in_transaction=False), now)
    results: list[dict[str, Any]] = out["results"]
    assert [r["index"] for r in results] == list(range(len(ops)))
    return [{k: v for k, v in r.items() if k not in ("index", "op", "ns", "key")} for r in results]


async def one(db: Database, op: dict[str, Any], now: datetime = T0) -> dict[str, Any]:
    return (await batch(db, [{"ns": "n", **op}], now))[0]


def iso(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- get / put / versions ------------------------------------------------------------------------------


async def test_put_get_and_versions_only_grow(db: Database) -> None:
    assert await one(db, {"op": "get", "key": "k"}) == {"found": False}
    first = await one(db, {"op": "put", "key": "k", "value": {"a": 1}, "forever": True})
    assert first == {"applied": True, "value": {"a": 1}, "version": first["version"], "expiresAt": None}
    got = await one(db, {"op": "get", "key": "k"}, T0 + S)
    assert got == {
        "found": True,
        "value": {"a": 1},
        "version": first["version"],
        "expiresAt": None,
        "updatedAt": iso(T0),
    }
    versions = [first["version"]]
    for i in range(3):  # other keys and rewrites: one global sequence
        versions.append((await one(db, {"op": "put", "key": f"k{i % 2}", "value": i, "ttlSeconds": 5}))["version"])
    versions.append((await one(db, {"op": "incr", "key": "c", "forever": True}))["version"])
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    # null is a value: found with value null is not a miss
    await one(db, {"op": "put", "key": "nil", "value": None, "forever": True})
    assert (await one(db, {"op": "get", "key": "nil"}))["found"] is True
    assert (await one(db, {"op": "get", "key": "nil"}))["value"] is None


async def test_result_carries_index_op_ns_key(db: Database) -> None:
    out = await kv_engine.apply(
        db, "default", validate_kv_ops([{"op": "get", "ns": "n", "key": "k"}], in_transaction=False)
    )
    assert out == {"results": [{"index": 0, "op": "get", "ns": "n", "key": "k", "found": False}]}


async def test_put_expect_zero_n_and_mismatch(db: Database) -> None:
    # expect N>0 on a missing key: absent, version 0, nothing created
    assert await one(db, {"op": "put", "key": "k", "value": 1, "forever": True, "expect": 7}) == {
        "applied": False,
        "reason": "absent",
        "value": None,
        "version": 0,
    }
    assert (await one(db, {"op": "get", "key": "k"}))["found"] is False
    v1 = await one(db, {"op": "put", "key": "k", "value": 1, "forever": True, "expect": 0})
    assert v1["applied"] is True
    lost = await one(db, {"op": "put", "key": "k", "value": 2, "forever": True, "expect": 0})
    assert lost == {"applied": False, "reason": "exists", "value": 1, "version": v1["version"], "expiresAt": None}
    v2 = await one(db, {"op": "put", "key": "k", "value": 2, "ttlSeconds": 60, "expect": v1["version"]})
    assert v2["applied"] is True and v2["version"] > v1["version"] and v2["expiresAt"] == iso(T0 + 60 * S)
    stale = await one(db, {"op": "put", "key": "k", "value": 3, "forever": True, "expect": v1["version"]})
    assert stale == {
        "applied": False,
        "reason": "version",
        "value": 2,
        "version": v2["version"],
        "expiresAt": iso(T0 + 60 * S),
    }


async def test_put_if_absent_twice(db: Database) -> None:
    won = await one(db, {"op": "putIfAbsent", "key": "m", "value": "first", "ttlSeconds": 60})
    assert won["applied"] is True
    lost = await one(db, {"op": "putIfAbsent", "key": "m", "value": "second", "ttlSeconds": 60})
    assert lost == {
        "applied": False,
        "reason": "exists",
        "value": "first",
        "version": won["version"],
        "expiresAt": iso(T0 + 60 * S),
    }


async def test_delete_edges(db: Database) -> None:
    assert await one(db, {"op": "delete", "key": "k"}) == {
        "applied": False,
        "reason": "absent",
        "value": None,
        "version": 0,
    }
    v = (await one(db, {"op": "put", "key": "k", "value": 1, "forever": True}))["version"]
    assert (await one(db, {"op": "delete", "key": "k", "expect": v + 1000}))["reason"] == "version"
    assert (await one(db, {"op": "delete", "key": "k", "expect": 0}))["reason"] == "exists"
    assert await one(db, {"op": "delete", "key": "k", "expect": v}) == {"applied": True, "value": None, "version": 0}
    assert (await one(db, {"op": "get", "key": "k"}))["found"] is False
    assert (await one(db, {"op": "delete", "key": "k", "expect": v}))["reason"] == "absent"
    again = await one(db, {"op": "put", "key": "k", "value": 2, "forever": True})
    assert again["version"] > v  # a re-created key never reuses a version


async def test_check_edges(db: Database) -> None:
    assert await one(db, {"op": "check", "key": "k", "expect": 0}) == {"applied": True, "value": None, "version": 0}
    assert (await one(db, {"op": "check", "key": "k", "expect": 3}))["reason"] == "absent"
    v = (await one(db, {"op": "put", "key": "k", "value": "x", "forever": True}))["version"]
    assert await one(db, {"op": "check", "key": "k", "expect": v}) == {
        "applied": True,
        "value": "x",
        "version": v,
        "expiresAt": None,
    }
    assert (await one(db, {"op": "check", "key": "k", "expect": 0}))["reason"] == "exists"
    mismatch = await one(db, {"op": "check", "key": "k", "expect": v + 1})
    assert (mismatch["reason"], mismatch["value"], mismatch["version"]) == ("version", "x", v)
    assert (await one(db, {"op": "get", "key": "k"}))["version"] == v  # check writes nothing


async def test_incr_limits_and_types(db: Database) -> None:
    first = await one(db, {"op": "incr", "key": "c", "ttlSeconds": 60})
    assert (first["applied"], first["value"], first["expiresAt"]) == (True, 1, iso(T0 + 60 * S))
    assert (await one(db, {"op": "incr", "key": "c", "delta": 5, "forever": True}))["value"] == 6
    crossing = await one(db, {"op": "incr", "key": "c", "delta": 5, "max": 10, "forever": True})
    assert (crossing["applied"], crossing["reason"], crossing["value"]) == (False, "limit", 6)
    at_max = await one(db, {"op": "incr", "key": "c", "delta": 4, "max": 10, "forever": True})
    assert (at_max["applied"], at_max["value"]) == (True, 10)
    below = await one(db, {"op": "incr", "key": "c", "delta": -11, "min": 0, "forever": True})
    assert (below["applied"], below["reason"], below["value"], below["version"]) == (
        False,
        "limit",
        10,
        at_max["version"],
    )
    to_min = await one(db, {"op": "incr", "key": "c", "delta": -10, "min": 0, "max": 10, "forever": True})
    assert (to_min["applied"], to_min["value"]) == (True, 0)
    assert (await one(db, {"op": "incr", "key": "c", "delta": 0.5, "forever": True}))["value"] == 0.5
    # a refused incr on a missing key creates nothing
    missing = await one(db, {"op": "incr", "key": "new", "delta": 3, "max": 2, "forever": True})
    assert missing == {"applied": False, "reason": "limit", "value": 0, "version": 0}
    assert (await one(db, {"op": "get", "key": "new"}))["found"] is False
    # a result no JSON double can hold is refused like a crossed limit
    await one(db, {"op": "put", "key": "huge", "value": 1.7e308, "forever": True})
    assert (await one(db, {"op": "incr", "key": "huge", "delta": 1e308, "forever": True}))["reason"] == "limit"
    # not a number: type
    for value in ("7", None, {"n": 1}, [1], True):
        await one(db, {"op": "put", "key": "s", "value": value, "forever": True})
        typed = await one(db, {"op": "incr", "key": "s", "forever": True})
        assert (typed["applied"], typed["reason"], typed["value"]) == (False, "type", value)


# --- time ------------------------------------------------------------------------------------------------


async def test_ttl_expiry_edge_at_expires_at_the_row_is_gone(db: Database) -> None:
    put = await one(db, {"op": "put", "key": "k", "value": 1, "ttlSeconds": 10})
    assert put["expiresAt"] == iso(T0 + 10 * S)
    assert (await one(db, {"op": "get", "key": "k"}, T0 + 10 * S - US))["found"] is True
    at = T0 + 10 * S
    assert (await one(db, {"op": "get", "key": "k"}, at))["found"] is False
    assert (await one(db, {"op": "check", "key": "k", "expect": put["version"]}, at))["reason"] == "absent"
    assert (await one(db, {"op": "delete", "key": "k"}, at))["reason"] == "absent"
    assert await one(db, {"op": "getMany", "keys": ["k"]}, at) == {"rows": [], "missing": ["k"]}
    assert (await one(db, {"op": "getPrefix", "prefix": "k"}, at))["rows"] == []
    # expect 0 wins over an expired row; the new row starts fresh
    again = await one(db, {"op": "putIfAbsent", "key": "k", "value": 2, "forever": True}, at)
    assert (again["applied"], again["expiresAt"]) == (True, None)
    assert again["version"] > put["version"]


async def test_incr_keeps_a_live_rows_ttl_and_restarts_an_expired_one(db: Database) -> None:
    assert (await one(db, {"op": "incr", "key": "w", "ttlSeconds": 10}))["expiresAt"] == iso(T0 + 10 * S)
    kept = await one(db, {"op": "incr", "key": "w", "ttlSeconds": 100}, T0 + 5 * S)
    assert (kept["value"], kept["expiresAt"]) == (2, iso(T0 + 10 * S))
    kept = await one(db, {"op": "incr", "key": "w", "forever": True}, T0 + 6 * S)
    assert (kept["value"], kept["expiresAt"]) == (3, iso(T0 + 10 * S))
    fresh = await one(db, {"op": "incr", "key": "w", "ttlSeconds": 100}, T0 + 10 * S)
    assert (fresh["value"], fresh["expiresAt"]) == (1, iso(T0 + 110 * S))


# --- reads ------------------------------------------------------------------------------------------------


async def test_get_many_rows_in_request_order_and_missing(db: Database) -> None:
    for k in ("a", "b", "c"):
        await one(db, {"op": "put", "key": k, "value": k.upper(), "forever": True})
    got = await one(db, {"op": "getMany", "keys": ["c", "x", "a", "c", "y"]})
    assert [r["key"] for r in got["rows"]] == ["c", "a"]
    assert [r["value"] for r in got["rows"]] == ["C", "A"]
    assert set(got["rows"][0]) == {"key", "value", "version", "expiresAt", "updatedAt"}
    assert got["missing"] == ["x", "y"]


async def test_get_prefix_pages_with_after_next_after_truncated(db: Database) -> None:
    ops: list[dict[str, Any]] = [
        {"op": "put", "ns": "n", "key": f"p:{i}", "value": i, "forever": True} for i in range(1, 6)
    ]
    ops += [
        {"op": "put", "ns": "n", "key": "q:1", "value": 0, "forever": True},
        {"op": "put", "ns": "other", "key": "p:9", "value": 0, "forever": True},
        {"op": "put", "ns": "n", "key": "p:0", "value": 0, "ttlSeconds": 1},  # expired at T0 + 1 s
    ]
    await batch(db, ops)
    now = T0 + S
    page = await one(db, {"op": "getPrefix", "prefix": "p:", "limit": 2}, now)
    assert ([r["key"] for r in page["rows"]], page["truncated"], page["nextAfter"]) == (["p:1", "p:2"], True, "p:2")
    assert page["prefix"] == "p:"
    page = await one(db, {"op": "getPrefix", "prefix": "p:", "limit": 2, "after": "p:2"}, now)
    assert ([r["key"] for r in page["rows"]], page["truncated"], page["nextAfter"]) == (["p:3", "p:4"], True, "p:4")
    page = await one(db, {"op": "getPrefix", "prefix": "p:", "limit": 2, "after": "p:4"}, now)
    assert ([r["key"] for r in page["rows"]], page["truncated"], page["nextAfter"]) == (["p:5"], False, None)
    exact = await one(db, {"op": "getPrefix", "prefix": "p:", "limit": 5}, now)
    assert (len(exact["rows"]), exact["truncated"], exact["nextAfter"]) == (5, False, None)
    keys_only = await one(db, {"op": "getPrefix", "prefix": "p:", "keysOnly": True}, now)
    assert [r["key"] for r in keys_only["rows"]] == [f"p:{i}" for i in range(1, 6)]
    assert all("value" not in r for r in keys_only["rows"]) and keys_only["truncated"] is False
    assert len((await one(db, {"op": "getPrefix", "prefix": "p:", "limit": 0}, now))["rows"]) == 1  # clamped
    assert (await one(db, {"op": "getPrefix", "prefix": "p:", "limit": 10**9}, now))["truncated"] is False


async def test_get_prefix_orders_by_bytes(db: Database) -> None:
    keys = ["k:b", "k:B", "k:a", "k:_", "k:é", "k:10", "k:9"]
    await batch(db, [{"op": "put", "ns": "n", "key": k, "value": 0, "forever": True} for k in keys])
    rows = (await one(db, {"op": "getPrefix", "prefix": "k:"}))["rows"]
    assert [r["key"] for r in rows] == sorted(keys, key=str.encode)


# --- batches ----------------------------------------------------------------------------------------------


async def test_a_lost_required_condition_writes_nothing_of_the_batch(db: Database, conn: asyncpg.Connection) -> None:
    v = (await one(db, {"op": "put", "key": "taken", "value": "old", "forever": True}))["version"]
    ops = [
        {"op": "put", "ns": "n", "key": "a", "value": 1, "forever": True},
        {"op": "incr", "ns": "n", "key": "c", "forever": True},
        {"op": "putIfAbsent", "ns": "n", "key": "taken", "value": "new", "forever": True, "required": True},
        {"op": "put", "ns": "n", "key": "after", "value": 1, "forever": True},
    ]
    with pytest.raises(Verdict) as caught:
        await batch(db, ops)
    assert caught.value.reason == "kv_precondition"
    assert caught.value.detail == {"failedIndex": 2, "kvReason": "exists", "version": v, "value": "old"}
    assert await conn.fetchval("SELECT array_agg(key ORDER BY key) FROM queen.kv") == ["taken"]
    # the same batch without `required` applies around the loser
    ops[2].pop("required")
    results = await batch(db, ops)
    assert [r["applied"] for r in results] == [True, True, False, True]
    assert "_lost" not in results[2]


async def test_required_absent_and_version_verdicts(db: Database) -> None:
    with pytest.raises(Verdict) as caught:
        await batch(db, [{"op": "check", "ns": "n", "key": "gone", "expect": 5, "required": True}])
    assert caught.value.detail == {"failedIndex": 0, "kvReason": "absent", "version": 0, "value": None}
    with pytest.raises(Verdict) as caught:
        await batch(db, [{"op": "incr", "ns": "n", "key": "c", "max": 0, "forever": True, "required": True}])
    assert caught.value.detail["kvReason"] == "limit"


async def test_reads_in_a_batch_see_its_earlier_writes(db: Database) -> None:
    results = await batch(
        db,
        [
            {"op": "get", "ns": "n", "key": "k"},
            {"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True},
            {"op": "get", "ns": "n", "key": "k"},
            {"op": "check", "ns": "n", "key": "k", "expect": 0},
        ],
    )
    assert [results[0]["found"], results[2]["found"], results[3]["reason"]] == [False, True, "exists"]


async def test_concurrent_writers_serialize_per_key(db: Database) -> None:
    async def incr() -> dict[str, Any]:
        return await one(db, {"op": "incr", "key": "hits", "forever": True})

    async def claim() -> dict[str, Any]:
        return await one(db, {"op": "putIfAbsent", "key": "once", "value": True, "forever": True})

    counted = await asyncio.gather(*(incr() for _ in range(20)))
    assert sorted(r["value"] for r in counted) == list(range(1, 21))
    claims = await asyncio.gather(*(claim() for _ in range(10)))
    assert sum(r["applied"] for r in claims) == 1


async def test_kv_lock_takes_one_two_int_lock_per_key_in_the_kv_class(conn: asyncpg.Connection) -> None:
    async with conn.transaction():
        await conn.execute("SELECT queen._kv_lock('t', ARRAY['a','a','b'], ARRAY['k','k','k'])")
        rows = await conn.fetch(
            "SELECT classid::bigint AS cls, objid::bigint AS obj, objsubid FROM pg_locks"
            " WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        )
        expected = await conn.fetch(
            "SELECT hashtext('t' || E'\\x1f' || ns || E'\\x1f' || 'k') AS h FROM unnest(ARRAY['a','b']) AS ns"
        )
    assert {r["cls"] for r in rows} == {locks.KV_KEY_CLASS}
    assert {r["objsubid"] for r in rows} == {2}  # the two-int form: never collides with bigint keys
    assert {r["obj"] % 2**32 for r in rows} == {e["h"] % 2**32 for e in expected}


# --- validation (400 kv_bad_request) ------------------------------------------------------------------------

BAD: list[tuple[Any, str, str]] = [
    ("nope", "bad_field", "operations: must be a list"),
    (["x"], "bad_field", "operations[0]: must be an object"),
    ([{"op": "frob", "ns": "n", "key": "k"}], "unknown_op", "operations[0].op"),
    ([{"op": "get", "ns": "n", "key": "k", "extra": 1}], "unknown_field", "operations[0].extra"),
    ([{"op": "get", "key": "k"}], "missing_field", "operations[0].ns"),
    ([{"op": "get", "ns": "", "key": "k"}], "bad_field", "operations[0].ns"),
    ([{"op": "get", "ns": "n", "key": 5}], "bad_field", "operations[0].key"),
    ([{"op": "get", "ns": "n\x01", "key": "k"}], "bad_field", "control characters"),
    ([{"op": "get", "ns": "n", "key": "k\x7f"}], "bad_field", "control characters"),
    ([{"op": "get", "ns": "n" * 129, "key": "k"}], "too_long", "operations[0].ns: is 129 bytes; the limit is 128"),
    ([{"op": "get", "ns": "n", "key": "é" * 513}], "too_long", "operations[0].key: is 1026 bytes"),
    ([{"op": "put", "ns": "n", "key": "k", "value": 1}], "bad_field", "exactly one of ttlSeconds"),
    ([{"op": "put", "ns": "n", "key": "k", "value": 1, "ttlSeconds": 5, "forever": True}], "bad_field", "exactly one"),
    (
        [{"op": "put", "ns": "n", "key": "k", "value": 1, "ttlSeconds": 0}],
        "bad_field",
        "ttlSeconds: must be an integer",
    ),
    ([{"op": "put", "ns": "n", "key": "k", "value": 1, "ttlSeconds": 1.5}], "bad_field", "ttlSeconds"),
    ([{"op": "put", "ns": "n", "key": "k", "value": 1, "ttlSeconds": True}], "bad_field", "ttlSeconds"),
    ([{"op": "put", "ns": "n", "key": "k", "value": 1, "forever": False}], "bad_field", "forever: must be true"),
    ([{"op": "put", "ns": "n", "key": "k", "forever": True}], "missing_field", "operations[0].value"),
    ([{"op": "put", "ns": "n", "key": "k", "value": "a\x00b", "forever": True}], "bad_field", "U+0000"),
    ([{"op": "put", "ns": "n", "key": "k", "value": "x" * (1 << 20), "forever": True}], "too_large", "value"),
    ([{"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True, "expect": -1}], "bad_field", "expect"),
    ([{"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True, "expect": "3"}], "bad_field", "expect"),
    ([{"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True, "expect": None}], "missing_field", "expect"),
    ([{"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True, "expect": False}], "bad_field", "expect"),
    ([{"op": "putIfAbsent", "ns": "n", "key": "k", "value": 1, "forever": True, "expect": 4}], "bad_field", "expect"),
    ([{"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True, "required": 1}], "bad_field", "required"),
    ([{"op": "check", "ns": "n", "key": "k"}], "missing_field", "operations[0].expect"),
    ([{"op": "check", "ns": "n", "key": "k", "expect": 1, "ttlSeconds": 5}], "unknown_field", "ttlSeconds"),
    ([{"op": "delete", "ns": "n", "key": "k", "forever": True}], "unknown_field", "forever"),
    ([{"op": "incr", "ns": "n", "key": "k", "delta": True, "forever": True}], "bad_field", "delta: must be a number"),
    ([{"op": "incr", "ns": "n", "key": "k", "delta": "1", "forever": True}], "bad_field", "delta"),
    ([{"op": "incr", "ns": "n", "key": "k", "max": False, "forever": True}], "bad_field", "max"),
    ([{"op": "incr", "ns": "n", "key": "k", "min": 5, "max": 1, "forever": True}], "bad_field", "min 5 is above max 1"),
    ([{"op": "incr", "ns": "n", "key": "k", "expect": 1, "forever": True}], "unknown_field", "expect"),
    ([{"op": "getMany", "ns": "n", "keys": []}], "bad_field", "keys: must be a non-empty list"),
    ([{"op": "getMany", "ns": "n"}], "missing_field", "keys"),
    ([{"op": "getMany", "ns": "n", "keys": ["a", ""]}], "bad_field", "keys: must be a non-empty string"),
    ([{"op": "getMany", "ns": "n", "keys": [f"k{i}" for i in range(257)]}], "too_many_keys", "the limit is 256"),
    ([{"op": "getPrefix", "ns": "n"}], "missing_field", "prefix"),
    ([{"op": "getPrefix", "ns": "n", "prefix": "p", "after": ""}], "bad_field", "after"),
    ([{"op": "getPrefix", "ns": "n", "prefix": "p", "limit": "5"}], "bad_field", "limit"),
    ([{"op": "getPrefix", "ns": "n", "prefix": "p", "keysOnly": "yes"}], "bad_field", "keysOnly"),
    ([{"op": "put", "ns": "queen-locks", "key": "x#0", "value": 1, "forever": True}], "reserved_namespace", "locks"),
    ([{"op": "delete", "ns": "queen-locks", "key": "x#0"}], "reserved_namespace", "operations[0].ns"),
    ([{"op": "incr", "ns": "queen-locks", "key": "x#0", "forever": True}], "reserved_namespace", "ns"),
    ([{"op": "get", "ns": "n", "key": "k"}] * 65, "too_many_ops", "65 operations; the limit is 64"),
    (
        [{"op": "getMany", "ns": "n", "keys": [f"{j}:{i}" for i in range(200)]} for j in range(2)],
        "too_many_keys",
        "operations[1]: the call touches more than 256 distinct keys",
    ),
    (
        [
            {"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True},
            {"op": "check", "ns": "n", "key": "k", "expect": 1},
            {"op": "delete", "ns": "n", "key": "k"},
        ],
        "duplicate_write",
        "operations[2].key: operations[0] already writes n/k; one write per key per call",
    ),
]


@pytest.mark.parametrize(("ops", "reason", "message"), BAD, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD)])
def test_validation_refuses_with_index_field_and_reason(ops: Any, reason: str, message: str) -> None:
    with pytest.raises(QueenError) as caught:
        validate_kv_ops(ops, in_transaction=False)
    assert caught.value.code == "kv_bad_request" and caught.value.status == 400
    assert caught.value.fields["reason"] == reason
    assert message in str(caught.value)


def test_validation_allows_reads_and_checks_of_the_locks_namespace_and_normalizes() -> None:
    ops = validate_kv_ops(
        [
            {"op": "get", "ns": "queen-locks", "key": "job#0"},
            {"op": "check", "ns": "queen-locks", "key": "job#0", "expect": 3, "required": True},
            {"op": "incr", "ns": "n", "key": "c", "ttlSeconds": 5, "required": False},
            {"op": "getMany", "ns": "n", "keys": ["a", "b", "a"]},
            {"op": "getPrefix", "ns": "n", "prefix": "p", "limit": 5000, "keysOnly": False},
            {"op": "put", "ns": "n", "key": "k", "value": None, "forever": True, "expect": 0},
        ],
        in_transaction=False,
    )
    assert ops[1] == {"op": "check", "ns": "queen-locks", "key": "job#0", "expect": 3, "required": True}
    assert ops[2] == {"op": "incr", "ns": "n", "key": "c", "ttlSeconds": 5, "delta": 1}
    assert ops[3]["keys"] == ["a", "b"]
    assert ops[4] == {"op": "getPrefix", "ns": "n", "prefix": "p", "limit": 1000}
    assert ops[5]["value"] is None


def test_validation_in_a_transaction_refuses_get_prefix_and_labels_kv() -> None:
    with pytest.raises(QueenError) as caught:
        validate_kv_ops(
            [{"op": "get", "ns": "n", "key": "k"}, {"op": "getPrefix", "ns": "n", "prefix": "p"}], in_transaction=True
        )
    assert caught.value.fields == {
        "detail": "kv[1].op: getPrefix is not allowed in a transaction",
        "reason": "not_in_transaction",
        "index": 1,
        "field": "op",
    }
    assert validate_kv_ops([], in_transaction=True) == []


# --- HTTP ---------------------------------------------------------------------------------------------------


async def test_http_batch_verdict_and_error_shapes(http: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    r = await http.post(
        "/api/v1/kv",
        json={
            "operations": [
                {"op": "put", "ns": "n", "key": "k", "value": {"v": 1}, "ttlSeconds": 60},
                {"op": "get", "ns": "n", "key": "k"},
            ]
        },
    )
    assert r.status_code == 200, r.text
    put, get = r.json()["results"]
    assert (put["index"], put["op"], put["ns"], put["key"], put["applied"]) == (0, "put", "n", "k", True)
    assert (get["index"], get["found"], get["value"], get["version"]) == (1, True, {"v": 1}, put["version"])

    r = await http.post(
        "/api/v1/kv",
        json={
            "operations": [
                {"op": "put", "ns": "n", "key": "other", "value": 1, "forever": True},
                {"op": "putIfAbsent", "ns": "n", "key": "k", "value": 2, "forever": True, "required": True},
            ]
        },
    )
    assert r.status_code == 200
    assert r.json() == {
        "ok": False,
        "reason": "kv_precondition",
        "failedIndex": 1,
        "kvReason": "exists",
        "version": put["version"],
        "value": {"v": 1},
    }
    assert await conn.fetchval("SELECT count(*) FROM queen.kv WHERE key = 'other'") == 0

    bad = [
        (b"", "bad_body"),
        (b"{nope", "bad_json"),
        (b"[]", "bad_body"),
        (b'{"ops": []}', "bad_body"),
        (
            b'{"operations": [{"op": "put", "ns": "queen-locks", "key": "a#0", "value": 1, "forever": true}]}',
            "reserved_namespace",
        ),
        (b'{"operations": [{"op": "get", "ns": "n", "key": "k", "x": 1}]}', "unknown_field"),
    ]
    for body, reason in bad:
        r = await http.post("/api/v1/kv", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, body
        got = r.json()
        assert (got["error"], got["code"], got["reason"]) == ("kv_bad_request", "kv_bad_request", reason), got
        assert isinstance(got["detail"], str) and got["detail"]
    assert (await http.post("/api/v1/kv", json={"operations": []})).json() == {"results": []}


async def test_http_database_down_is_503_in_the_family_envelope(http: httpx.AsyncClient, broker: Broker) -> None:
    await broker.app.state.queen.db.close()
    r = await http.post("/api/v1/kv", json={"operations": [{"op": "get", "ns": "n", "key": "k"}]})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["code"] == r.json()["error"] == "db_unavailable"


# --- sweep --------------------------------------------------------------------------------------------------


async def test_sweep_deletes_only_expired_rows_and_yields_to_its_key(
    db: Database, conn: asyncpg.Connection, db_url: str
) -> None:
    await batch(
        db,
        [{"op": "put", "ns": "n", "key": f"e{i}", "value": i, "ttlSeconds": 10 + i} for i in range(5)]
        + [{"op": "put", "ns": "n", "key": "live", "value": 0, "forever": True}],
    )
    job = KvSweep()
    other = await asyncpg.connect(db_url)
    try:
        async with other.transaction():
            await other.execute("SELECT pg_advisory_xact_lock($1)", locks.KV_SWEEP_LOCK)
            assert await job.run_once(db, T0 + 60 * S) == 0
    finally:
        await other.close()
    assert await conn.fetchval("SELECT queen.kv_sweep_v1(2, $1)", T0 + 12 * S) == 2  # e0, e1 (at expires_at)
    assert await conn.fetchval("SELECT queen.kv_sweep_v1(10, $1)", T0 + 12 * S) == 1  # e2 expires at 12 s
    assert await job.tick(db, T0 + 60 * S) == 2
    assert await conn.fetchval("SELECT array_agg(key) FROM queen.kv") == ["live"]


# --- end to end with queen-mq 2.6.0 --------------------------------------------------------------------------


async def test_official_client_kv(broker: Broker) -> None:
    async with Queen(broker.url) as client:
        kv = client.kv
        put = await kv.put("orders", "order-1", {"status": "paid"}, ttl_seconds=3600)
        assert put and put["version"] > 0
        got = await kv.get("orders", "order-1")
        assert got and got["value"] == {"status": "paid"} and got["version"] == put["version"]
        assert not await kv.get("orders", "nope")
        fenced = await kv.put("orders", "order-1", {"status": "shipping"}, forever=True, expect=put["version"])
        assert fenced and fenced["version"] > put["version"]
        stale = await kv.put("orders", "order-1", {"status": "lost"}, forever=True, expect=put["version"])
        assert not stale and stale["reason"] == "version" and stale["value"] == {"status": "shipping"}

        many = await kv.get_many("orders", ["order-1", "order-2"])
        assert [r["key"] for r in many["rows"]] == ["order-1"] and many["missing"] == ["order-2"]

        await kv.batch([kv.op.put("idx", f"u:{i:03}", i, forever=True) for i in range(25)])
        page = await kv.get_prefix("idx", "u:", limit=10)
        assert len(page["rows"]) == 10 and page["truncated"] and page["nextAfter"] == "u:009"
        everything = await kv.list_all("idx", "u:", limit=10)
        assert [r["value"] for r in everything] == list(range(25))

        assert (await kv.incr("rate", "acme", delta=2, max=3, ttl_seconds=60))["value"] == 2
        refused = await kv.incr("rate", "acme", delta=2, max=3, ttl_seconds=60)
        assert not refused and refused["reason"] == "limit" and refused["value"] == 2
        assert await kv.check("orders", "order-1", expect=fenced["version"])

        assert await kv.once("dedupe", "payment-1", ttl_seconds=60) is True
        assert await kv.once("dedupe", "payment-1", ttl_seconds=60) is False

        assert await kv.delete("orders", "order-1")
        gone = await kv.delete("orders", "order-1")
        assert not gone and gone["reason"] == "absent"

        # a lost required condition: the 2.6.0 client reads no results from the verdict body
        assert await kv.batch([kv.op.put("dedupe", "payment-1", 1, forever=True, expect=0, required=True)]) == []
        with pytest.raises(KvError) as missing:
            await kv.put_if_absent("dedupe", "payment-1", 1, forever=True, required=True)
        assert missing.value.code == "kv_result_missing"

        with pytest.raises(KvError) as refused_ns:
            await kv.put("queen-locks", "x#0", 1, forever=True)
        err = refused_ns.value
        assert (err.status, err.code, err.reason) == (400, "kv_bad_request", "reserved_namespace")
        assert err.detail and "queen-locks" in err.detail and err.detail in str(err)
