"""Pop discovery at scale: a pop naming no partition finds its group's oldest claimable
partition through log_consumers_ready_idx without visiting the other pending partitions, and the
cursor's `head_at` stays right through push, pop, ack, leases and the race between a catching-up ack and
a push in flight. The EXPLAIN guards read the plans of the statements pop_v1 itself runs (auto_explain,
nested statements, ANALYZE + BUFFERS), so a plan change inside the procedure fails here."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

N_PARTITIONS = 3000  # realistic, and fast enough: the guard is about shape, not time

POP = (
    "SELECT partition_name, lease_start, lease_end FROM queen.pop_v1('default', $1, $2, $3, $4, $5, $6, $7, "
    "gen_random_uuid(), $8, NULL, NULL, $9)"
)


def P(i: int, prefix: str = "p") -> str:
    """The name fill() gives partition i (zero-padded: name order is creation order)."""
    return f"{prefix}{i:05d}"


async def fill(conn: asyncpg.Connection, queue: str, n: int, prefix: str = "p", start: int = 0) -> None:
    """n partitions of `queue` with one message each, in one push_v1 call (raw codec-0 frames)."""
    await conn.execute(
        """
        SELECT count(*) FROM queen.push_v1(
            'default',
            array_fill($1::text, ARRAY[$2::int]),
            ARRAY(SELECT $3 || lpad(i::text, 5, '0') FROM generate_series($4::int, $4 + $2 - 1) i ORDER BY i),
            ARRAY(SELECT queen._frame(gen_random_uuid(), $3 || i, convert_to('1', 'UTF8'))
                    FROM generate_series($4::int, $4 + $2 - 1) i ORDER BY i),
            ARRAY(SELECT g FROM generate_series(1, $2::int) g),
            ARRAY(SELECT md5($1 || $3 || i || random())::uuid FROM generate_series($4::int, $4 + $2 - 1) i ORDER BY i),
            ARRAY(SELECT gen_random_uuid() FROM generate_series(1, $2::int)),
            NULL,
            array_fill(0::smallint, ARRAY[$2::int]))
        """,
        queue,
        n,
        prefix,
        start,
    )


async def pop(
    conn: asyncpg.Connection,
    queue: str | None,
    *,
    group: str = "g",
    partition: str | None = None,
    namespace: str | None = None,
    batch: int = 1,
    partitions: int = 1,
    auto_ack: bool = False,
    now: Any = None,
) -> list[asyncpg.Record]:
    return list(await conn.fetch(POP, queue, namespace, None, partition, group, batch, partitions, auto_ack, now))


async def ack(conn: asyncpg.Connection, queue: str, partition: str, group: str = "g") -> None:
    """Commit a group's cursor through everything it leased (straight, as the ack does it)."""
    await conn.execute(
        """UPDATE queen.log_consumers lc SET cursor_offset = lc.lease_end, lease_id = NULL,
                  lease_expires_at = NULL, lease_end = NULL
             FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id
            WHERE lc.partition_id = p.id AND q.name = $1 AND p.name = $2 AND lc.consumer_group = $3""",
        queue,
        partition,
        group,
    )


class Plans:
    """auto_explain's JSON plans of the statements run inside pop_v1 (nested), as NOTICEs."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.notices: list[str] = []

    async def __aenter__(self) -> Plans:
        await self.conn.execute("LOAD 'auto_explain'")
        for name, value in {
            "auto_explain.log_min_duration": "0",
            "auto_explain.log_nested_statements": "on",
            "auto_explain.log_analyze": "on",
            "auto_explain.log_buffers": "on",
            "auto_explain.log_timing": "off",
            "auto_explain.log_format": "json",
            "auto_explain.log_level": "notice",
        }.items():
            await self.conn.execute(f"SET {name} = '{value}'")
        self.conn.add_log_listener(self._listen)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.conn.remove_log_listener(self._listen)
        await self.conn.execute("SET auto_explain.log_min_duration = '-1'")

    def _listen(self, _conn: object, message: Any) -> None:
        self.notices.append(str(message.message))

    def docs(self) -> list[dict[str, Any]]:
        """Every plan seen, as auto_explain's JSON documents."""
        return [json.loads(t[t.index("{") :]) for t in self.notices if "{" in t]

    def scans(self, watched: set[str]) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
        """(node type, relation, node, plan document) of every plan node reading a watched relation."""
        return [
            (node["Node Type"], node["Relation Name"], node, doc)
            for doc in self.docs()
            for node in nodes(doc["Plan"])
            if node.get("Relation Name") in watched
        ]

    def discovery(self) -> list[dict[str, Any]]:
        """The plans of pop_v1's discovery statements (the cursors that lock log_consumers rows)."""
        found = []
        for text in self.notices:
            if "{" not in text:
                continue
            doc = json.loads(text[text.index("{") :])
            query = doc.get("Query Text", "")
            if "FOR UPDATE OF lc SKIP LOCKED" in query or "CROSS JOIN LATERAL" in query:
                found.append(doc)
        return found


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", []):
        out.extend(nodes(child))
    return out


def examined(doc: dict[str, Any]) -> tuple[list[str], int]:
    """(scans on log_consumers/log_partitions as 'Node Type on relation using index', rows those scans
    produced or threw away) for one plan, over all its loops."""
    scans: list[str] = []
    rows = 0
    for node in nodes(doc["Plan"]):
        rel = node.get("Relation Name")
        if rel in ("log_consumers", "log_partitions"):
            scans.append(f"{node['Node Type']} on {rel} using {node.get('Index Name')}")
            loops = int(node.get("Actual Loops", 1))
            rows += int((node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * loops)
    return scans, rows


def assert_no_scan_of_all(docs: list[dict[str, Any]], bound: int) -> None:
    assert docs, "auto_explain reported no discovery statement: did the query text change?"
    for doc in docs:
        scans, rows = examined(doc)
        assert not [s for s in scans if s.startswith("Seq Scan")], (
            f"discovery scans a whole table: {scans}\n{json.dumps(doc['Plan'], indent=1)[:4000]}"
        )
        assert rows <= bound, (
            f"discovery examined {rows} rows of log_consumers/log_partitions with {N_PARTITIONS} pending "
            f"partitions (bound {bound}): {scans}\n{json.dumps(doc['Plan'], indent=1)[:4000]}"
        )


async def group_with_pending(conn: asyncpg.Connection, queue: str = "q") -> None:
    """The group first sees the queue with one partition (its cursor rows exist before the rest), then
    N_PARTITIONS partitions get a message each: every new cursor is woken by the push."""
    await fill(conn, queue, 1, prefix="seed")
    assert [r["partition_name"] for r in await pop(conn, queue)] == [P(0, "seed")]
    await ack(conn, queue, P(0, "seed"))
    await fill(conn, queue, N_PARTITIONS)


async def test_discovery_plan_does_not_scan_pending_partitions(conn: asyncpg.Connection) -> None:
    await group_with_pending(conn)
    await conn.execute("ANALYZE queen.log_consumers; ANALYZE queen.log_partitions; ANALYZE queen.log_segments")
    async with Plans(conn) as plans:
        claimed = []
        for _ in range(8):  # past plpgsql's switch to a generic plan (after 5 executions)
            claimed += [r["partition_name"] for r in await pop(conn, "q")]
    # oldest first: the partitions were written in name order, in one call (same time): then by id
    assert claimed == [P(i) for i in range(8)]
    docs = plans.discovery()
    assert len(docs) == 8
    for doc in docs:
        scans, _ = examined(doc)
        assert "Index Scan on log_consumers using log_consumers_ready_idx" in scans, scans
    assert_no_scan_of_all(docs, bound=64)


async def test_discovery_plan_without_statistics(conn: asyncpg.Connection) -> None:
    """Right after a bulk load nobody has analyzed the tables yet: the plan must not depend on it."""
    await group_with_pending(conn)
    async with Plans(conn) as plans:
        for _ in range(7):
            assert len(await pop(conn, "q")) == 1
    assert_no_scan_of_all(plans.discovery(), bound=64)


async def test_discovery_passes_leased_partitions_cheaply_and_in_order(conn: asyncpg.Connection) -> None:
    """The leased ones are the oldest heads: a pop walks past them (bounded by the live leases, not by
    the pending partitions) and takes the next oldest; an expired lease is claimable again, first."""
    await group_with_pending(conn)
    leased = [r["partition_name"] for r in await pop(conn, "q", partitions=20, batch=20)]
    assert leased == [P(i) for i in range(20)]
    async with Plans(conn) as plans:
        assert [r["partition_name"] for r in await pop(conn, "q")] == [P(20)]
    assert_no_scan_of_all(plans.discovery(), bound=64)
    later = await conn.fetchval("SELECT now() + interval '1 hour'")
    assert [r["partition_name"] for r in await pop(conn, "q", partitions=2, batch=2, now=later)] == [P(0), P(1)]


async def test_named_partition_and_namespace_pops_use_keys(conn: asyncpg.Connection) -> None:
    await group_with_pending(conn)
    await fill(conn, "q2", 200)
    await conn.execute("UPDATE queen.queues SET namespace = 'ns' WHERE name IN ('q', 'q2')")
    async with Plans(conn) as plans:
        assert [r["partition_name"] for r in await pop(conn, "q", partition=P(2500))] == [P(2500)]
        assert await pop(conn, "q", partition=P(2500)) == []  # leased now
        got = [r["partition_name"] for r in await pop(conn, None, namespace="ns", partitions=3, batch=3)]
    assert got == [P(0), P(1), P(2)]  # q's are older than q2's
    assert_no_scan_of_all(plans.discovery(), bound=3 * 64)


async def test_caught_up_cursors_leave_the_index_and_come_back(conn: asyncpg.Connection) -> None:
    await fill(conn, "q", 3)
    rows = await pop(conn, "q", partitions=3, batch=3, auto_ack=True)
    assert sorted(r["partition_name"] for r in rows) == [P(0), P(1), P(2)]
    heads = await conn.fetch("SELECT head_at FROM queen.log_consumers WHERE consumer_group = 'g'")
    assert [r["head_at"] for r in heads] == [None, None, None]
    assert await pop(conn, "q") == []
    await fill(conn, "q", 1, start=1)  # p1 gets a second message: only its cursor wakes
    pending = await conn.fetch(
        "SELECT p.name FROM queen.log_consumers lc JOIN queen.log_partitions p ON p.id = lc.partition_id "
        "WHERE lc.head_at IS NOT NULL"
    )
    assert [r["name"] for r in pending] == [P(1)]
    got = await pop(conn, "q")
    assert [(r["partition_name"], r["lease_start"], r["lease_end"]) for r in got] == [(P(1), 1, 2)]


async def test_ack_catching_up_while_a_push_is_in_flight_keeps_the_partition(
    conn: asyncpg.Connection, db_url: str
) -> None:
    """The race the try-lock closes: a push holds the partition and appends; meanwhile the ack moves the
    cursor to the old end. The push cannot see the ack's uncommitted 'caught up', the ack cannot see
    the push's message: the ack must leave the cursor pending, and the next pop gets the message."""
    await fill(conn, "q", 1)
    assert len(await pop(conn, "q")) == 1
    pusher = await asyncpg.connect(db_url)
    try:
        tx = pusher.transaction()
        await tx.start()
        await fill(pusher, "q", 1)  # p0 offset 1, uncommitted, partition row held
        await ack(conn, "q", P(0))  # cursor 0 -> 1 while the push is in flight
        assert await conn.fetchval("SELECT head_at IS NOT NULL FROM queen.log_consumers") is True
        await tx.commit()
    finally:
        await pusher.close()
    got = await pop(conn, "q")
    assert [(r["partition_name"], r["lease_start"]) for r in got] == [(P(0), 1)]


async def test_marked_pending_but_nothing_came_is_cleaned_by_the_pop(conn: asyncpg.Connection, db_url: str) -> None:
    """Same race, but the push rolls back: the cursor is pending with nothing to read. The pop that finds
    it marks it caught up and still answers the next claimable partition in the same call."""
    await fill(conn, "q", 2)
    assert [r["partition_name"] for r in await pop(conn, "q")] == [P(0)]
    pusher = await asyncpg.connect(db_url)
    try:
        tx = pusher.transaction()
        await tx.start()
        await fill(pusher, "q", 1)
        await ack(conn, "q", P(0))
        await tx.rollback()
    finally:
        await pusher.close()
    await conn.execute(  # make the stale one the oldest
        "UPDATE queen.log_consumers SET head_at = '-infinity' WHERE partition_id = "
        "(SELECT id FROM queen.log_partitions WHERE name = $1)",
        P(0),
    )
    assert [r["partition_name"] for r in await pop(conn, "q")] == [P(1)]
    assert (
        await conn.fetchval(
            "SELECT head_at FROM queen.log_consumers lc JOIN queen.log_partitions p ON p.id = lc.partition_id "
            "WHERE p.name = $1",
            P(0),
        )
        is None
    )


async def test_delayed_messages_wait_in_the_index(conn: asyncpg.Connection) -> None:
    await fill(conn, "q", 2)
    await conn.execute("UPDATE queen.queues SET delayed_processing = 60 WHERE name = 'q'")
    assert await pop(conn, "q") == []
    later = await conn.fetchval("SELECT now() + interval '61 seconds'")
    assert [r["partition_name"] for r in await pop(conn, "q", now=later)] == [P(0)]


async def test_new_group_on_many_partitions_gets_heads(conn: asyncpg.Connection) -> None:
    """A group's first pop creates its cursor rows (insert trigger): heads set, and the pop that created
    them claims the oldest at once."""
    await fill(conn, "q", 500)
    assert [r["partition_name"] for r in await pop(conn, "q", group="late")] == [P(0)]
    assert (
        await conn.fetchval(
            "SELECT count(*) FROM queen.log_consumers WHERE consumer_group = 'late' AND head_at IS NOT NULL"
        )
        == 500
    )


async def test_cursor_updates_are_hot_where_the_index_does_not_change(conn: asyncpg.Connection) -> None:
    """A lease extend or a partial ack inside one segment changes no indexed column of log_consumers:
    those updates are HOT (pg_stat_user_tables.n_tup_hot_upd)."""
    await conn.execute(
        """SELECT count(*) FROM queen.push_v1('default', ARRAY['q'], ARRAY['p'],
               ARRAY[queen._frame(gen_random_uuid(), 'a', '1') || queen._frame(gen_random_uuid(), 'b', '2')],
               ARRAY[1, 1], ARRAY[md5('a')::uuid, md5('b')::uuid], ARRAY[gen_random_uuid(), gen_random_uuid()],
               NULL, ARRAY[0::smallint])"""
    )
    lease = await conn.fetchval("SELECT gen_random_uuid()")
    await conn.fetch(
        "SELECT * FROM queen.pop_v1('default', 'q', NULL, NULL, NULL, 'g', 2, 1, $1, false, NULL, NULL)", lease
    )

    async def counts() -> tuple[int, int]:
        await conn.execute("SELECT pg_stat_force_next_flush()")
        row = await conn.fetchrow(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE schemaname = 'queen' AND relname = 'log_consumers'"
        )
        assert row is not None
        return int(row[0]), int(row[1])

    upd0, hot0 = await counts()
    assert (await conn.fetchrow("SELECT * FROM queen.lease_extend_v1('default', $1)", lease))["renewed"] == 1
    pid = await conn.fetchval("SELECT id FROM queen.log_partitions WHERE name = 'p'")
    res = await conn.fetch(
        "SELECT * FROM queen.ack_v1('default', ARRAY[$1::bigint], ARRAY[md5('a')::uuid], ARRAY['a'], ARRAY[$2::uuid],"
        " ARRAY['g'], ARRAY['completed'], ARRAY[NULL::text])",
        pid,
        lease,
    )
    assert res[0]["success"] is True and res[0]["lease_released"] is False
    upd1, hot1 = await counts()
    assert upd1 - upd0 == 2
    assert hot1 - hot0 == 2, "lease extend and an ack inside the segment should be HOT updates"


async def test_new_group_from_now_starts_caught_up_and_wakes(conn: asyncpg.Connection) -> None:
    """A group subscribed from now: every cursor is created caught up (head_at NULL, through the insert
    trigger's try-lock), so its first pop gets nothing; the next push into one partition wakes that one."""
    await fill(conn, "q", 50)
    new_pop = (
        "SELECT partition_name, lease_start FROM queen.pop_v1('default', 'q', NULL, NULL, NULL, 'fresh', 1, 1, "
        "gen_random_uuid(), true, 'new', NULL)"
    )
    assert await conn.fetch(new_pop) == []
    assert (
        await conn.fetchval(
            "SELECT count(*) FILTER (WHERE head_at IS NULL) FROM queen.log_consumers WHERE consumer_group = 'fresh'"
        )
        == 50
    )
    await fill(conn, "q", 1, start=7)
    assert [(r["partition_name"], r["lease_start"]) for r in await conn.fetch(new_pop)] == [(P(7), 1)]
