"""pop_v1's fast path (the usual pop: a queue named, no partition, one partition, an existing group, no
delayedProcessing/windowBuffer, not auto-ack) answers and leaves the cursor rows exactly as the general
path does, through leases, redeliveries, partial acks, nacks, retries into the DLQ and passed-over
offsets; and it runs two statements (auto_explain counts them), not the general path's eight."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import random
import re
import uuid
from typing import Any

import asyncpg
import pytest

POP = (
    "SELECT * FROM queen.pop_v1('default', $1, NULL, NULL, NULL, $2, $3, 1, $4, coalesce($7, false), 'all', NULL,"
    " $5, $6)"
)
ACK = (
    "SELECT * FROM queen.ack_v1('default', $1::bigint[], $2::uuid[], $3::text[], $4::uuid[], $5::text[], "
    "$6::text[], $7::text[], $8)"
)
T0 = dt.datetime(2026, 12, 2, 8, 0, tzinfo=dt.UTC)
PARTS = ("p0", "p1", "p2")


def hash_of(txn: str) -> str:
    return str(uuid.UUID(bytes=hashlib.md5(txn.encode()).digest()))


async def push(conn: asyncpg.Connection, queue: str, part: str, txns: list[str], now: dt.datetime) -> None:
    """One segment of raw frames in `part` (push_v1, the transactionIds hashed as md5)."""
    await conn.execute(
        """SELECT count(*) FROM queen.push_v1('default', array_fill($1::text, ARRAY[1]), ARRAY[$2],
               ARRAY[(SELECT string_agg(queen._frame(gen_random_uuid(), t, convert_to(t, 'UTF8')), ''::bytea
                                         ORDER BY o) FROM unnest($3::text[]) WITH ORDINALITY AS u(t, o))],
               array_fill(1, ARRAY[cardinality($3::text[])]),
               ARRAY(SELECT md5(t)::uuid FROM unnest($3::text[]) WITH ORDINALITY AS u(t, o) ORDER BY o),
               ARRAY(SELECT gen_random_uuid() FROM unnest($3::text[])), $4)""",
        queue,
        part,
        txns,
        now,
    )


def shape(rows: list[asyncpg.Record]) -> list[tuple[Any, ...]]:
    """A pop's answer without the queue's own names and ids."""
    return [
        (r["partition_name"], r["lease_start"], r["lease_end"], r["redelivered_end"], r["attempts"],
         list(r["acked"]), r["lease_expires_at"], r["base_offset"], r["end_offset"], r["dropped"])
        for r in rows
    ]  # fmt: skip


async def cursors(conn: asyncpg.Connection, queue: str) -> list[tuple[Any, ...]]:
    return [
        tuple(r)
        for r in await conn.fetch(
            """SELECT p.name, lc.consumer_group, lc.cursor_offset, lc.lease_end, lc.lease_expires_at,
                      lc.delivered_end, lc.attempts, lc.fail_offset, lc.failures, lc.acked_total, lc.head_at,
                      lc.lease_id IS NULL, lc.claimed_at
                 FROM queen.log_consumers lc JOIN queen.log_partitions p ON p.id = lc.partition_id
                 JOIN queen.queues q ON q.id = lc.queue_id
                WHERE q.name = $1 ORDER BY 1, 2""",
            queue,
        )
    ]


class Side:
    """One queue driven through pop_v1 with the fast path on or off."""

    def __init__(self, conn: asyncpg.Connection, queue: str, fast: bool) -> None:
        self.conn, self.queue, self.fast = conn, queue, fast
        self.leases: list[tuple[uuid.UUID, str, list[asyncpg.Record]]] = []

    async def pop(
        self, group: str, batch: int, now: dt.datetime, lease_s: int | None, auto_ack: bool
    ) -> list[tuple[Any, ...]]:
        lease = uuid.uuid4()
        await self.conn.execute(f"SET queen.pop_fast = '{'on' if self.fast else 'off'}'")
        rows = await self.conn.fetch(POP, self.queue, group, batch, lease, now, lease_s, auto_ack)
        await self.conn.execute("RESET queen.pop_fast")
        if rows and not auto_ack:
            self.leases.append((lease, group, rows))
        return shape(rows)

    async def ack(self, k: int, status: str, count: int, skip: int, now: dt.datetime) -> list[tuple[Any, ...]]:
        """Ack `count` messages of the k-th lease from its `skip`-th on (out of order when skip > 0); a
        message's transactionId is `partition-offset`."""
        lease, group, rows = self.leases[k]
        r0 = rows[0]
        offs = list(range(r0["lease_start"], r0["lease_end"]))[skip : skip + count]
        pid = r0["partition_id"]
        names = [f"{r0['partition_name']}-{o}" for o in offs]
        n = len(names)
        res = await self.conn.fetch(
            ACK, [pid] * n, [hash_of(t) for t in names], names, [lease] * n, [group] * n, [status] * n, [None] * n, now
        )
        # error texts name the partition id: each side has its own
        return [(r["success"], re.sub(r"partition \d+", "partition N", r["error"] or ""), r["lease_released"], r["dlq"],
                 r["noop"]) for r in res]  # fmt: skip


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_fast_path_answers_as_the_general_path(conn: asyncpg.Connection, seed: int) -> None:
    rnd = random.Random(seed)
    sides = [Side(conn, "fast", True), Side(conn, "slow", False)]
    sizes = {p: 0 for p in PARTS}
    now = T0

    async def push_all() -> None:
        part = rnd.choice(PARTS)
        n = rnd.randint(1, 30)
        txns = [f"{part}-{sizes[part] + i}" for i in range(n)]  # transactionId = partition-offset
        sizes[part] += n
        for s in sides:
            await push(conn, s.queue, part, txns, now)

    for _ in range(4):
        await push_all()
    for s in sides:
        await conn.execute("UPDATE queen.queues SET retry_limit = 1, lease_time = 30 WHERE name = $1", s.queue)
    seen = {"passes": 0, "dlq": 0, "redelivered": 0, "auto_acked": 0}
    for step in range(150):
        now += dt.timedelta(seconds=rnd.choice([0.001, 0.001, 1, 1, 2, 5, 40]))
        what = rnd.random()
        if what < 0.15:
            await push_all()
            continue
        if what < 0.25:  # a message passed over (as POST /messages/{pid}/{txn}/dlq does it)
            part, group, ahead = rnd.choice(PARTS), rnd.choice(["__QUEUE_MODE__", "g"]), rnd.randint(0, 3)
            for s in sides:
                await conn.execute(
                    """INSERT INTO queen.log_passes (partition_id, consumer_group, msg_offset)
                       SELECT lc.partition_id, lc.consumer_group, lc.cursor_offset + $4
                         FROM queen.log_consumers lc JOIN queen.log_partitions p ON p.id = lc.partition_id
                         JOIN queen.queues q ON q.id = p.queue_id
                        WHERE q.name = $1 AND p.name = $2 AND lc.consumer_group = $3
                          AND lc.cursor_offset + $4 < p.next_offset
                       ON CONFLICT DO NOTHING""",
                    s.queue, part, group, ahead,
                )  # fmt: skip
            continue
        if what < 0.5 or not sides[0].leases:
            group = rnd.choice(["__QUEUE_MODE__", "g"])
            batch = rnd.choice([1, 3, 10, 100])
            lease_s = rnd.choice([None, None, 10])
            auto_ack = rnd.random() < 0.15
            got = [await s.pop(group, batch, now, lease_s, auto_ack) for s in sides]
            seen["auto_acked"] += bool(auto_ack and got[0])
            assert got[0] == got[1], f"step {step}: pop {group} batch {batch}"
        else:
            k = len(sides[0].leases) - rnd.choice([1, 1, 1, 2, 3])
            if k < 0:
                continue
            if len(sides[1].leases) != len(sides[0].leases):
                pytest.fail("the two sides leased differently")
            status = rnd.choice(["completed", "completed", "failed", "dlq"])
            count, skip = rnd.randint(1, 5), rnd.choice([0, 0, 1, 2])
            got = [await s.ack(k, status, count, skip, now) for s in sides]
            assert got[0] == got[1], f"step {step}: ack of lease {k}"
        assert await cursors(conn, "fast") == await cursors(conn, "slow"), f"step {step}"
        seen["passes"] += await conn.fetchval("SELECT count(*) FROM queen.log_passes")
        seen["dlq"] = await conn.fetchval("SELECT count(*) FROM queen.log_dlq")
        seen["redelivered"] += await conn.fetchval("SELECT count(*) FROM queen.log_consumers WHERE attempts > 1")
    # the walk reached the rare paths: passed-over offsets, dead letters, redeliveries, auto-acks
    assert len(sides[0].leases) > 20 and all(seen.values()), (len(sides[0].leases), seen)


async def test_fast_path_passes_over_offsets_at_the_cursor(conn: asyncpg.Connection) -> None:
    """A group that passes over offsets in the partition is served by the general path: the cursor
    moves past the passed-over offsets at its head, and those inside the lease come back in `acked`."""
    await push(conn, "q", "p0", [f"p0-{i}" for i in range(6)], T0)
    first = await conn.fetch(POP, "q", "g", 1, uuid.uuid4(), T0, None, None)  # creates the group
    assert [(r["lease_start"], r["lease_end"]) for r in first] == [(0, 1)]
    pid = first[0]["partition_id"]
    await conn.execute(
        "INSERT INTO queen.log_passes (partition_id, consumer_group, msg_offset) VALUES ($1, 'g', 0), ($1, 'g', 1),"
        " ($1, 'g', 3)",
        pid,
    )
    later = T0 + dt.timedelta(hours=1)  # the first lease expired
    rows = await conn.fetch(POP, "q", "g", 3, uuid.uuid4(), later, None, None)
    assert [(r["lease_start"], r["lease_end"], list(r["acked"])) for r in rows] == [(2, 5, [3])]
    assert await conn.fetchval("SELECT cursor_offset FROM queen.log_consumers WHERE consumer_group = 'g'") == 2
    assert await conn.fetchval("SELECT array_agg(msg_offset) FROM queen.log_passes") == [3]


async def test_usual_pop_runs_two_statements(conn: asyncpg.Connection) -> None:
    """The fast path is taken for the usual pop (and the general path for a partition named): counted
    through auto_explain's nested statements."""
    for part in ("p0", "p1", "p2"):
        await push(conn, "q", part, [f"{part}-{i}" for i in range(30)], T0)
    await conn.fetch(POP, "q", "g", 10, uuid.uuid4(), T0, None, None)  # creates the group: the general path
    notices: list[str] = []
    await conn.execute("LOAD 'auto_explain'")
    for name, value in {"log_min_duration": "0", "log_nested_statements": "on", "log_format": "json",
                        "log_level": "notice"}.items():  # fmt: skip
        await conn.execute(f"SET auto_explain.{name} = '{value}'")
    conn.add_log_listener(lambda _c, m: notices.append(str(m.message)))

    async def statements(sql: str, *args: Any) -> list[str]:
        notices.clear()
        await conn.fetch(sql, *args)
        texts = [json.loads(t[t.index("{") :])["Query Text"] for t in notices if "{" in t]
        return [t for t in texts if "pop_v1" not in t]  # the call itself

    usual = await statements(POP, "q", "g", 10, uuid.uuid4(), T0, None, None)
    assert len(usual) == 2, usual
    assert "FOR UPDATE OF lc SKIP LOCKED" in usual[0] and "UPDATE queen.log_consumers" in usual[1]
    named = await statements(
        "SELECT * FROM queen.pop_v1('default', 'q', NULL, NULL, 'p2', 'g', 10, 1, $1, false, 'all', NULL, $2)",
        uuid.uuid4(),
        T0,
    )
    assert len(named) > 2 and not any("fq AS" in t for t in named), named
    idle = await statements(POP, "q", "g", 10, uuid.uuid4(), T0, None, None)  # all three leased now
    assert len(idle) == 1, idle
    # at-most-once: the same two statements, then the trigger's that keep head_at as the cursor moves
    await conn.fetch(POP, "q", "__QUEUE_MODE__", 5, uuid.uuid4(), T0, None, True)  # creates the group
    auto = await statements(POP, "q", "__QUEUE_MODE__", 5, uuid.uuid4(), T0, None, True)
    assert "fq AS" in auto[0] and "claim AS" in auto[-1], auto
    assert not [t for t in auto if "array_agg" in t], auto  # no general-path lookup, no _pass_over


def test_the_claim_is_written_once() -> None:
    """Both paths (and leased and auto-ack alike) claim through ONE statement of pop_v1: a path that
    states the claim again would fail here before the comparisons above must find the difference."""
    from queen_pg.db.apply import sql_dir

    text = (sql_dir() / "procedures" / "030_pop.sql").read_text()
    claims = re.findall(r"UPDATE queen\.log_consumers lc\s+SET [^;]*?lease_id =", text)
    assert len(claims) == 1, claims
    assert text.count("INSERT INTO queen.log_leases") == 1
