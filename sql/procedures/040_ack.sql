-- queen._ack_settle: settle delivered messages for their consumer groups. An ack is an offset commit
-- (docs/wire.md#ack-offset-commit): a group's position in a partition is one cursor, and nothing above it is remembered.
--
-- Called by: queen.ack_v3 (POST /api/v1/ack and /ack/batch, queen_pg/engine/ack.py: the items packed)
--          and queen.ack_v1 (one row per item: queen.ack_v2 under a request key, queen.transaction_v1,
--          a batch of more kinds than ack_v3 packs), both below.
-- Inputs:  parallel arrays, one entry per ack item: partition id, xxh3-128 hash of the transactionId,
--          transactionId text (for the DLQ row), lease id (NULL = no lease check), consumer group,
--          status ('completed' | 'failed' | 'retry' | 'dlq'; the broker maps 'success' to
--          'completed'), error text; p_now (NULL = the clock, read after each cursor row's lock).
-- Result:  ONE row of 1-based item indexes, sparse (a fully accepted batch is five empty arrays):
--          o_refused (success=false) with o_errors (their readable errors, same order), o_released
--          (leaseReleased), o_dlq, o_noop. Every other item is success, moved the cursor, no DLQ.
--          The call itself never raises for a refused item.
-- Locks:   (docs/architecture.md#lock-order #3) log_consumers rows FOR UPDATE, ascending (partition_id, group); under
--          them it inserts log_dlq rows (no foreign keys: no lock on a partition or queue row) and
--          deletes the cursor's log_passes rows; then it updates each row it holds (queen._ack_commit,
--          after that row's own lock: never a new lock). A cursor it moves to the partition's end tries the
--          partition row FOR SHARE SKIP LOCKED (queen._cursor_head, by trigger: never waits). Nothing else.
-- Range ack: per cursor row, one statement resolves every item and checks the common batch (all
--          `completed`, at or above the cursor, inside the live lease they name, or naming none); such a
--          batch commits through its highest offset without judging item by item. Any other batch is
--          judged item by item (the rules below; the same verdicts either way). A call whose items are
--          all of one kind (p_uniform: queen.ack_v3 with one partition, group, lease and status, the
--          usual batch) resolves them first in ONE index scan over its hashes (no per-item subquery,
--          ~25 % less for that statement); when that cannot decide, the statement above does.
-- Resolve: an item's transactionId names the oldest of its messages at or above the cursor (the one
--          the group has not settled), else the newest below it. None in that partition: the item is
--          `unresolvable` (success=false; it changes nothing, and the rest of the call, the real
--          leased batch included, is judged as if it were not there).
-- Lease:   with a lease id, the lease must be the row's live lease (same id, not expired) and the
--          message inside the leased range; or, for an offset below the cursor, the row's last lease
--          (released by its acks, or run out with nobody claiming since: only its holder can have
--          committed the offset, so a resent ack is answered as one below the cursor). Without a
--          lease id the check is skipped.
-- Rules, per cursor row and call (the offsets are those of the items that passed the checks above):
--   * completed / dlq at N commits the cursor through N: every earlier offset of that lease that was
--     not acked explicitly is completed with it. noop=false.
--   * a nack (failed / retry) at N with the lowest such N: the cursor stops at N (everything below N
--     is committed, N and everything after it are delivered again: completed items above N are
--     success with noop=true, they come back too), and the lease is released. `failed` at the lowest
--     nack charges the queue's retryLimit once per call (fail_offset/failures on the cursor row);
--     `retry` does not charge. When the charged message has failed more than retryLimit times it goes
--     to log_dlq and counts as done: the cursor moves past it up to the next nack (or through the
--     highest completed item).
--   * below the cursor: completed / dlq succeeds with noop=true; a nack is refused (success=false,
--     "already committed"): it cannot be taken back.
--   * 'dlq' dead-letters its message at once (and commits through it).
--   The cursor then passes over the group's log_passes offsets. The lease is released when the cursor
--   reached lease_end or a nack applied; leaseReleased is reported on the row's last item.
-- Commit:  what moving a cursor does to its row (the commit rule) is stated once, by queen._ack_commit
--          below; every path that moves a cursor here calls it (ack_v3's fast path for one row and for
--          several, step 4 of queen._ack_settle). It is a PL/pgSQL function called as an expression
--          (a LANGUAGE sql function holding an UPDATE is planned on every call, PL/pgSQL keeps the
--          plan), per cursor row: a commit is one UPDATE of one row plus the call. Measured against the
--          rule written inline in each path (alternated A/B, PostgreSQL CPU per ack_v3 call): ~5 % more
--          for the usual ack (one lease, hinted), ~10 us a row more for a fused ack of several rows (an
--          UPDATE a row instead of one for all: +15-18 % at 8 rows). Taking arrays instead (one UPDATE
--          over unnested rows, a CTE to aggregate the answer) made the fused ack even but the usual one
--          20-28 % dearer. tests/test_sql_written_once.py fails on a second statement stating the rule.
-- Plans:   _ack_settle, ack_v1 and ack_v3 run with plan_cache_mode = force_generic_plan (nested calls
--          inherit it): PL/pgSQL kept custom plans for the array-parameter statements (the decode, the
--          one-statement judgement, the answer) and re-planned them on every call; measured 5-21 %
--          less PostgreSQL CPU per ack (1 and 100 items), same plans. And with
--          enable_seqscan = off (so are _pass_over, _ack_wakes and _cursor_head, which the cursor's
--          trigger calls): a connection keeps its generic plans, and plans made while the tables were
--          ANALYZEd small read log_consumers, log_partitions, log_segments and log_txns whole, per cursor
--          row or per item, for as long as the connection lived (tests/test_ack_plans.py).
-- Cost:    linear in the items, on both paths. The item path reads an item's fields in PL/pgSQL
--          (p_txn_ids[o]: the parameters are expanded arrays, O(1) a read), never in a FOR-query's
--          SELECT list: a cursor copies its parameters flat, and a flat text[] (or a uuid[] with NULLs)
--          is walked from the start on every subscript (20,000 items: seconds). No `= ANY (array)` per
--          item either.

CREATE OR REPLACE FUNCTION queen._pass_over(p_pid bigint, p_group text, p_cursor bigint)
RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off AS $$
-- The cursor moved past the offsets the group passes over (queen.log_passes) that start at p_cursor;
-- the rows below the result are deleted. The caller holds the cursor row (docs/architecture.md#lock-order #3).
DECLARE
    v_cursor bigint := p_cursor;
    v_offs   bigint[];
BEGIN
    SELECT array_agg(lp.msg_offset ORDER BY lp.msg_offset) INTO v_offs
      FROM queen.log_passes lp WHERE lp.partition_id = p_pid AND lp.consumer_group = p_group;
    IF v_offs IS NULL THEN
        RETURN v_cursor;
    END IF;
    WHILE v_cursor = ANY (v_offs) LOOP
        v_cursor := v_cursor + 1;
    END LOOP;
    DELETE FROM queen.log_passes lp
     WHERE lp.partition_id = p_pid AND lp.consumer_group = p_group AND lp.msg_offset < v_cursor;
    RETURN v_cursor;
END;
$$;

-- queen._ack_commit: the commit rule, the one statement of the ack that moves a cursor (called by
-- queen._ack_settle's step 4 and queen.ack_v3's fast paths). The row's cursor goes to p_new, counting
-- p_acked as acked (NULL: p_new - the cursor); the retry budget becomes p_fail_off/p_fails as charged
-- (p_fails NULL: the row's own), reset once the cursor passed the charged offset; a lease that was live
-- (p_live) is released at its end or after a nack (p_nacked), released_lease_id keeping it; the attempts
-- end past delivered_end. Result: released (this commit released the lease) and wake (then, with
-- messages left, head_at being kept by the cursor's trigger: the queue's name, for the parked pops).
-- Locks:   the cursor row, which the caller already holds FOR UPDATE (docs/architecture.md#lock-order #3);
--          the trigger's queen._cursor_head as in the callers' headers. Plans: enable_seqscan = off like
--          the other ack functions (tests/test_ack_plans.py; the SET measured no dearer per ack), and
--          plan_cache_mode = force_generic_plan inherited from its callers.
CREATE OR REPLACE FUNCTION queen._ack_commit(p_pid bigint, p_group text, p_new bigint, p_acked bigint,
                                             p_live boolean, p_nacked boolean, p_fail_off bigint,
                                             p_fails integer, OUT released boolean, OUT wake text)
LANGUAGE plpgsql SET enable_seqscan = off AS $$  -- plpgsql: the UPDATE's plan is kept (sql: planned per call)
BEGIN
    UPDATE queen.log_consumers lc
       SET cursor_offset = p_new,
           acked_total = lc.acked_total + coalesce(p_acked, p_new - lc.cursor_offset),
           fail_offset = CASE WHEN p_fails IS NULL AND lc.fail_offset < p_new THEN NULL
                              WHEN p_fails IS NULL THEN lc.fail_offset
                              WHEN p_fail_off < p_new THEN NULL ELSE p_fail_off END,
           failures = CASE WHEN p_fails IS NULL AND lc.fail_offset < p_new THEN 0
                           WHEN p_fails IS NULL THEN lc.failures
                           WHEN p_fail_off < p_new THEN 0 ELSE p_fails END,
           released_lease_id = CASE WHEN p_live AND (p_nacked OR p_new >= lc.lease_end) THEN lc.lease_id
                                    ELSE lc.released_lease_id END,
           lease_id = CASE WHEN p_live AND (p_nacked OR p_new >= lc.lease_end) THEN NULL ELSE lc.lease_id END,
           lease_expires_at = CASE WHEN p_live AND (p_nacked OR p_new >= lc.lease_end) THEN NULL
                                   ELSE lc.lease_expires_at END,
           lease_end = CASE WHEN p_live AND (p_nacked OR p_new >= lc.lease_end) THEN NULL ELSE lc.lease_end END,
           attempts = CASE WHEN p_new >= lc.delivered_end THEN 0 ELSE lc.attempts END
     WHERE lc.partition_id = p_pid AND lc.consumer_group = p_group
    RETURNING p_live AND lc.lease_id IS NULL,
              CASE WHEN p_live AND lc.lease_id IS NULL AND lc.head_at IS NOT NULL
                   THEN (SELECT q.name FROM queen.queues q WHERE q.id = lc.queue_id) END
         INTO released, wake;
END;
$$;

-- queen._ack_wakes: the queues (names, distinct) in which an ack left one of the given cursor rows
-- claimable: no live lease and something at or above the cursor (head_at, kept by the cursor's trigger).
-- Called by: queen.ack_v3 (the look-up path; its fast path asks the cursor row it updates itself) and
--          queen.transaction_v1 after their acks, and by the broker after a queen.ack_v1/ack_v2 call
--          (queen_pg/engine/ack.py): the broker wakes the pops parked on those queues, here and over the
--          mesh, as after a push (a released lease, a nack, or a row a pop skipped while the ack held it).
-- Locks:   none (reads the rows the caller holds). A queue named here may be claimed away by anyone
--          before the woken pop gets there: a wake is a hint (a spurious one costs a claim attempt).
CREATE OR REPLACE FUNCTION queen._ack_wakes(p_tenant text, p_partition_ids bigint[], p_groups text[],
                                            p_now timestamptz DEFAULT NULL)
RETURNS text[]
LANGUAGE plpgsql SET enable_seqscan = off AS $$  -- plpgsql: a fresh snapshot, after the caller's updates
DECLARE
    v_now   timestamptz := coalesce(p_now, clock_timestamp());
    v_names text[];
BEGIN
    SELECT coalesce(array_agg(DISTINCT q.name), '{}') INTO v_names
      FROM (SELECT DISTINCT u.pid, u.grp FROM unnest(p_partition_ids, p_groups) AS u(pid, grp)) k
      JOIN queen.log_consumers lc ON lc.partition_id = k.pid AND lc.consumer_group = k.grp
      JOIN queen.queues q ON q.id = lc.queue_id
     WHERE lc.tenant = p_tenant AND lc.head_at IS NOT NULL
       AND (lc.lease_id IS NULL OR lc.lease_expires_at <= v_now);
    RETURN v_names;
END;
$$;

CREATE OR REPLACE FUNCTION queen._ack_hashes(p_items bytea)
RETURNS uuid[]
LANGUAGE sql IMMUTABLE AS $$
-- The xxh3-128 hashes of queen.ack_v3's packed items (bytes 0..15 of each), in item order.
SELECT ARRAY(SELECT encode(substring(p_items FROM i * 26 + 1 FOR 16), 'hex')::uuid
               FROM generate_series(0, length(p_items) / 26 - 1) AS i ORDER BY i)
$$;

CREATE OR REPLACE FUNCTION queen._ack_txns(p_items bytea, p_txns bytea)
RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
-- The transactionIds of queen.ack_v3's packed items (bytes 18..25 of each: start and length in p_txns).
-- (PostgreSQL's | and << share one precedence: the shifts are parenthesized.)
SELECT coalesce(array_agg(convert_from(substring(p_txns FROM x.s + 1 FOR x.l), 'UTF8') ORDER BY x.i), '{}')
  FROM (SELECT g.i,
               get_byte(p_items, g.o + 18) + (get_byte(p_items, g.o + 19) << 8)
                 + (get_byte(p_items, g.o + 20) << 16) + (get_byte(p_items, g.o + 21) << 24) AS s,
               get_byte(p_items, g.o + 22) + (get_byte(p_items, g.o + 23) << 8)
                 + (get_byte(p_items, g.o + 24) << 16) + (get_byte(p_items, g.o + 25) << 24) AS l
          FROM generate_series(0, length(p_items) / 26 - 1) AS s(i)
         CROSS JOIN LATERAL (SELECT s.i, s.i * 26 AS o) AS g) AS x
$$;

CREATE OR REPLACE FUNCTION queen._ack_settle(
    p_tenant         text,
    p_partition_ids  bigint[],
    p_hashes         uuid[],
    p_txn_ids        text[],          -- NULL: decoded from p_items/p_txns when needed (queen.ack_v3)
    p_lease_ids      uuid[],
    p_groups         text[],
    p_statuses       text[],
    p_errors         text[],
    p_now            timestamptz DEFAULT NULL,
    p_items          bytea DEFAULT NULL,
    p_txns           bytea DEFAULT NULL,
    p_uniform        boolean DEFAULT false, -- every item names one partition, group, lease and status
    -- queen.ack_v3's hints: the cursor rows (partition, group) whose items are all of one kind that
    -- has one, and that kind's index into p_hints (3 values per kind, queen.ack_v3's p_hint)
    p_hint_pids      bigint[] DEFAULT NULL,
    p_hint_groups    text[] DEFAULT NULL,
    p_hint_kinds     integer[] DEFAULT NULL,
    p_hints          bigint[] DEFAULT NULL
) RETURNS TABLE (o_refused integer[], o_errors text[], o_released integer[], o_dlq integer[],
                 o_noop integer[])
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$  -- Plans: see the header
DECLARE
    v_now       timestamptz;
    v_n_items   integer := cardinality(p_partition_ids);
    r_error     text[] := array_fill(NULL::text, ARRAY[v_n_items]);
    r_released  boolean[] := array_fill(false, ARRAY[v_n_items]);
    r_dlq       boolean[] := array_fill(false, ARRAY[v_n_items]);
    r_noop      boolean[] := array_fill(false, ARRAY[v_n_items]);
    r_off       bigint[] := array_fill(NULL::bigint, ARRAY[v_n_items]);
    r_msgid     uuid[] := array_fill(NULL::uuid, ARRAY[v_n_items]);
    r_created   timestamptz[] := array_fill(NULL::timestamptz, ARRAY[v_n_items]);
    k           record;
    it          record;
    it_ord      integer;    -- step 1's item: its index and its fields
    it_hash     uuid;
    it_txn      text;
    it_lease    uuid;
    it_status   text;
    c           queen.log_consumers%ROWTYPE;
    v_limit     integer;
    v_live      boolean;
    v_start     bigint;     -- the cursor when the call took the row
    v_new       bigint;     -- the cursor the call leaves
    v_hi        bigint;     -- highest completed/dlq offset at or above v_start
    v_pend      integer[];  -- items at or above v_start that passed the checks
    v_nacks     bigint[];   -- their nack offsets
    v_next      bigint;
    v_dead      bigint;     -- the offset step 2 dead-lettered on this row (NULL: none)
    v_dlq       integer[];  -- step 3: the `dlq` items under the new cursor ...
    v_dlq_offs  bigint[];   -- ... and their offsets
    v_off       bigint;
    v_msgid     uuid;
    v_created   timestamptz;
    v_last      integer;
    v_is_nack   boolean;
    o           integer;
    -- the lowest `failed` item of the call on this row
    f_off       bigint;
    f_ord       integer;
    -- the one-statement judgement (step 0)
    v_passes    boolean;
    v_unres     bigint;
    v_max       bigint;
    v_fast      boolean;
    v_plain     boolean := true;   -- every row took the range ack: the answer is at most leaseReleased
    v_rel       integer[] := '{}';
    v_h         bigint[];   -- this row's hint {start, lowest, highest}, or NULL
    i_h         integer;
    v_acked     bigint;     -- step 4: the offsets the commit counts as acked
    v_released  boolean;
BEGIN
    FOR k IN
        SELECT u.pid, u.grp, array_agg(u.ord::integer ORDER BY u.ord) AS ords
          FROM unnest(p_partition_ids, p_groups) WITH ORDINALITY AS u(pid, grp, ord)
         GROUP BY u.pid, u.grp
         ORDER BY u.pid, u.grp
    LOOP
        SELECT lc.* INTO c
          FROM queen.log_consumers lc
          JOIN queen.log_partitions p ON p.id = lc.partition_id
         WHERE lc.partition_id = k.pid AND lc.consumer_group = k.grp AND p.tenant = p_tenant
           FOR UPDATE OF lc;
        v_now := coalesce(p_now, clock_timestamp());  -- after the row lock: the lease is judged now
        IF NOT FOUND THEN
            v_plain := false;
            FOR it IN SELECT u AS ord FROM unnest(k.ords) AS u
            LOOP
                r_error[it.ord] := CASE WHEN queen._queue_mode(k.grp)
                    THEN format('partition %s has no queue-mode cursor (never popped, or deleted)', k.pid)
                    ELSE format('consumer group %s has no cursor on partition %s', k.grp, k.pid) END;
            END LOOP;
            CONTINUE;
        END IF;
        v_live := c.lease_id IS NOT NULL AND c.lease_expires_at > v_now;
        v_start := c.cursor_offset;
        v_hi := NULL;
        v_pend := '{}';
        v_nacks := '{}';
        v_dead := NULL;
        v_dlq := '{}';
        v_dlq_offs := '{}';
        f_off := NULL;
        f_ord := NULL;

        -- 0. the common batch, resolved and judged in ONE statement: every item `completed`, resolved at
        --    or above the cursor and, when it names a lease, inside the row's live lease. Then step 1
        --    would accept every item and step 3 has nothing to do: the cursor goes through the highest
        --    offset (a range ack). Anything else (a nack, a dlq, an unresolvable or resent item, a lease
        --    not held) is judged item by item below, as before.
        v_passes := EXISTS (SELECT 1 FROM queen.log_passes ps
                             WHERE ps.partition_id = k.pid AND ps.consumer_group = k.grp);
        v_fast := false;
        v_h := NULL;
        FOR i_h IN 1 .. coalesce(cardinality(p_hint_pids), 0) LOOP
            IF p_hint_pids[i_h] = k.pid AND p_hint_groups[i_h] = k.grp THEN
                v_h := p_hints[(p_hint_kinds[i_h] - 1) * 3 + 1 : p_hint_kinds[i_h] * 3];
                EXIT;
            END IF;
        END LOOP;
        IF v_h[3] IS NOT NULL AND NOT v_passes AND v_live AND p_statuses[k.ords[1]] = 'completed'
           AND p_lease_ids[k.ords[1]] = c.lease_id AND v_h[1] <= v_start AND v_h[2] >= v_start
           AND v_h[3] < c.lease_end
           -- (the segment holding v_h[2]: the newest starting at or below it, one index probe)
           AND (SELECT s.end_offset FROM queen.log_segments s
                 WHERE s.partition_id = k.pid AND s.base_offset <= v_h[2]
                 ORDER BY s.base_offset DESC LIMIT 1) > v_h[2] THEN
            -- the broker resolved every item from the lease it handed out (queen_pg/engine/leases.py): it
            -- knew every offset of [v_h[1], lease_end), so with the cursor at or above v_h[1] and no
            -- passed-over offsets, each item's oldest offset at or above the cursor is the one it found,
            -- all inside the live lease; the segments from v_h[2] on are still there (retention takes
            -- the oldest first), so are their hashes. No hash is looked up.
            v_unres := 0;
            v_max := v_h[3];
            v_fast := true;
        ELSIF p_uniform AND NOT v_passes AND v_live AND p_statuses[1] = 'completed'
           AND (p_lease_ids[1] IS NULL OR p_lease_ids[1] = c.lease_id) THEN
            p_hashes := coalesce(p_hashes, queen._ack_hashes(p_items));
            -- the usual batch (one kind, `completed`, the live lease, no passed-over offsets): one index
            -- scan resolves every hash to its oldest offset at or above the cursor; the range ack holds
            -- when each distinct hash has one and, under a lease, all of them are inside it
            SELECT count(*), max(m.off) INTO v_unres, v_max
              FROM (SELECT min(t.msg_offset) AS off FROM queen.log_txns t
                     WHERE t.partition_id = k.pid AND t.txn_hash = ANY (p_hashes) AND t.msg_offset >= v_start
                     GROUP BY t.txn_hash) m;
            -- one row per distinct hash found: all items resolved when that is every item (no repeats,
            -- the usual batch), or else every distinct hash
            v_fast := (v_unres = v_n_items OR v_unres = (SELECT count(DISTINCT h) FROM unnest(p_hashes) AS h))
                      AND (p_lease_ids[1] IS NULL OR v_max < c.lease_end);
            v_unres := 0;
        END IF;
        IF NOT v_fast THEN
        p_hashes := coalesce(p_hashes, queen._ack_hashes(p_items));  -- decoded only when looked up
        SELECT count(*) FILTER (WHERE r.off IS NULL), max(r.off),
               -- coalesce: bool_and skips NULLs, and an unknown (a NULL column) is never "plain"
               bool_and(coalesce(r.off >= v_start AND p_statuses[u.ord] = 'completed'
                                 AND (p_lease_ids[u.ord] IS NULL
                                      OR (v_live AND p_lease_ids[u.ord] = c.lease_id AND r.off < c.lease_end)),
                                 false))
          INTO v_unres, v_max, v_fast
          FROM unnest(k.ords) AS u(ord)
          LEFT JOIN LATERAL (
                SELECT t.msg_offset AS off
                  FROM queen.log_txns t
                 WHERE t.partition_id = k.pid AND t.txn_hash = p_hashes[u.ord]
                   AND (NOT v_passes
                        OR NOT EXISTS (SELECT 1 FROM queen.log_passes ps
                                        WHERE ps.partition_id = k.pid AND ps.consumer_group = k.grp
                                          AND ps.msg_offset = t.msg_offset))
                 ORDER BY (t.msg_offset < v_start),
                          CASE WHEN t.msg_offset < v_start THEN -t.msg_offset ELSE t.msg_offset END
                 LIMIT 1) r ON true;
        END IF;
        IF v_unres = 0 AND v_fast THEN
            v_hi := v_max;
            v_last := k.ords[cardinality(k.ords)];
        ELSE
            v_plain := false;
            IF p_txn_ids IS NULL THEN  -- packed (queen.ack_v3): only this path reads the texts
                p_txn_ids := queen._ack_txns(p_items, p_txns);
            END IF;
            -- 1. resolve and judge every item against the cursor as the call found it
            FOREACH o IN ARRAY k.ords LOOP
                it_ord := o;
                it_hash := p_hashes[o];
                it_txn := p_txn_ids[o];
                it_lease := p_lease_ids[o];
                it_status := p_statuses[o];
                v_last := it_ord;
                v_is_nack := it_status IN ('failed', 'retry');
                SELECT t.msg_offset, t.message_id, t.created_at INTO v_off, v_msgid, v_created
                  FROM queen.log_txns t
                 WHERE t.partition_id = k.pid AND t.txn_hash = it_hash
                   -- a copy this group passes over (a dead letter requeued for another group) is never
                   -- this group's message: resolving to it would commit past messages nobody read
                   AND NOT EXISTS (SELECT 1 FROM queen.log_passes ps
                                    WHERE ps.partition_id = k.pid AND ps.consumer_group = k.grp
                                      AND ps.msg_offset = t.msg_offset)
                 ORDER BY (t.msg_offset < v_start),
                          CASE WHEN t.msg_offset < v_start THEN -t.msg_offset ELSE t.msg_offset END
                 LIMIT 1;
                IF NOT FOUND THEN
                    r_error[it_ord] := format('transactionId %s is unresolvable in partition %s '
                                              '(never pushed there, or its hash is gone): nothing changed',
                                              it_txn, k.pid);
                    CONTINUE;
                END IF;
                r_off[it_ord] := v_off;
                r_msgid[it_ord] := v_msgid;
                r_created[it_ord] := v_created;

                IF it_lease IS NOT NULL THEN
                    IF v_live AND c.lease_id = it_lease THEN
                        IF v_off >= c.lease_end AND v_off >= v_start THEN
                            r_error[it_ord] := 'message is not part of this lease';
                            CONTINUE;
                        END IF;
                    ELSIF NOT (v_off < v_start AND (coalesce(c.lease_id = it_lease, false)
                                                    OR coalesce(c.released_lease_id = it_lease, false))) THEN
                        r_error[it_ord] := CASE WHEN c.lease_id = it_lease THEN 'lease expired'
                            ELSE 'lease is not held (expired or taken by another consumer)' END;
                        CONTINUE;
                    END IF;
                    -- (below the cursor under the row's last lease, released or run out with nobody
                    -- claiming since: only its holder committed it; a resent ack, answered as such)
                END IF;

                IF v_off < v_start THEN
                    IF v_is_nack THEN
                        r_error[it_ord] := format('offset %s is already committed (the cursor is at %s): '
                                                  'a nack cannot take it back', v_off, v_start);
                    ELSE
                        r_noop[it_ord] := true;
                    END IF;
                    CONTINUE;
                END IF;

                v_pend := v_pend || it_ord;
                IF v_is_nack THEN
                    v_nacks := v_nacks || v_off;
                    IF it_status = 'failed' AND (f_off IS NULL OR v_off < f_off) THEN
                        f_off := v_off;
                        f_ord := it_ord;
                    END IF;
                ELSE
                    v_hi := greatest(v_hi, v_off);
                END IF;
            END LOOP;
        END IF;

        -- 2. where the cursor goes: through the highest completed offset, clamped at the lowest nack
        v_new := coalesce(v_hi + 1, v_start);
        v_next := (SELECT min(n) FROM unnest(v_nacks) AS n);
        IF v_next IS NOT NULL THEN
            v_new := v_next;
            IF f_off = v_next THEN  -- the lowest nack is a `failed`: charge the budget once
                IF c.fail_offset = f_off THEN
                    c.failures := c.failures + 1;
                ELSE
                    c.fail_offset := f_off;
                    c.failures := 1;
                END IF;
                SELECT q.retry_limit INTO v_limit FROM queen.queues q WHERE q.id = c.queue_id;
                IF c.failures > v_limit THEN
                    INSERT INTO queen.log_dlq (tenant, queue_id, partition_id, consumer_group, msg_offset,
                                               message_id, transaction_id, error, attempts, created_at, failed_at)
                    VALUES (p_tenant, c.queue_id, k.pid, k.grp, f_off, r_msgid[f_ord], p_txn_ids[f_ord],
                            p_errors[f_ord], c.failures, r_created[f_ord], v_now);
                    r_dlq[f_ord] := true;
                    v_dead := f_off;
                    c.fail_offset := NULL;
                    c.failures := 0;
                    -- done: the cursor moves on, up to the next nack
                    v_new := greatest(f_off + 1, coalesce(v_hi + 1, 0));
                    v_next := (SELECT min(n) FROM unnest(v_nacks) AS n WHERE n > f_off);
                    IF v_next < v_new THEN
                        v_new := v_next;
                    END IF;
                END IF;
            END IF;
        END IF;

        -- 3. answer the items that passed the checks; explicit dead letters under the new cursor
        FOREACH o IN ARRAY v_pend LOOP
            IF p_statuses[o] IN ('failed', 'retry') THEN
                CONTINUE;
            END IF;
            IF r_off[o] >= v_new THEN
                r_noop[o] := true;      -- above a nack: delivered again
                CONTINUE;
            END IF;
            IF p_statuses[o] = 'dlq' AND r_off[o] IS DISTINCT FROM v_dead THEN
                v_dlq := v_dlq || o;
                v_dlq_offs := v_dlq_offs || r_off[o];
            END IF;
        END LOOP;
        -- one dead letter per offset, for the first item naming it, in item order: chosen in one
        -- statement (a `= ANY (dead so far)` per item was quadratic in a batch of dlq items)
        IF cardinality(v_dlq) > 0 THEN
        FOR it IN
            SELECT x.o
              FROM (SELECT DISTINCT ON (d.off) d.o FROM unnest(v_dlq, v_dlq_offs) AS d(o, off)
                     ORDER BY d.off, d.o) AS x
             ORDER BY x.o
        LOOP
            o := it.o;
            INSERT INTO queen.log_dlq (tenant, queue_id, partition_id, consumer_group, msg_offset,
                                       message_id, transaction_id, error, attempts, created_at, failed_at)
            VALUES (p_tenant, c.queue_id, k.pid, k.grp, r_off[o], r_msgid[o], p_txn_ids[o], p_errors[o],
                    greatest(c.attempts, 1), r_created[o], v_now);
            r_dlq[o] := true;
        END LOOP;
        END IF;

        -- 4. commit: the cursor past the offsets the group passes over (not counted as acked), the
        --    lease released after a nack too, the retry budget as step 2 charged it (the commit rule)
        v_acked := v_new - v_start;
        IF v_new > v_start THEN
            v_new := queen._pass_over(k.pid, k.grp, v_new);
        END IF;
        v_released := (queen._ack_commit(k.pid, k.grp, v_new, v_acked, v_live, cardinality(v_nacks) > 0,
                                         c.fail_offset, c.failures)).released;
        IF v_released THEN
            r_released[v_last] := true;
            v_rel := v_rel || v_last;
        END IF;
    END LOOP;

    -- sparse: a fully accepted batch is five empty arrays (one small row to send and decode). Read
    -- with unnest, not r_error[g.i]: subscripting a text array walks it from the start (quadratic).
    IF v_plain AND cardinality(v_rel) <= 1 THEN  -- every row a range ack: only leaseReleased to say
        o_refused := '{}';
        o_errors := '{}';
        o_released := v_rel;
        o_dlq := '{}';
        o_noop := '{}';
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT coalesce(array_agg(g.i ORDER BY g.i) FILTER (WHERE g.err IS NOT NULL), '{}'),
           coalesce(array_agg(g.err ORDER BY g.i) FILTER (WHERE g.err IS NOT NULL), '{}'),
           coalesce(array_agg(g.i ORDER BY g.i) FILTER (WHERE g.rel), '{}'),
           coalesce(array_agg(g.i ORDER BY g.i) FILTER (WHERE g.dead), '{}'),
           coalesce(array_agg(g.i ORDER BY g.i) FILTER (WHERE g.nop), '{}')
      INTO o_refused, o_errors, o_released, o_dlq, o_noop
      FROM unnest(r_error, r_released, r_dlq, r_noop) WITH ORDINALITY AS g(err, rel, dead, nop, i)
     WHERE g.err IS NOT NULL OR g.rel OR g.dead OR g.nop;
    RETURN NEXT;
END;
$$;

-- queen.ack_v1: the verdicts as one row per item (idx, success, error, lease_released, dlq, noop), in
-- input order, for the items as parallel arrays (the inputs of queen._ack_settle). Called by queen.ack_v2
-- (the outcome window), queen.transaction_v1, and the broker for a batch naming more (partition, group,
-- lease, status) kinds than ack_v3's packing holds (queen_pg/engine/ack.py); rules and locks are
-- queen._ack_settle's.
CREATE OR REPLACE FUNCTION queen.ack_v1(
    p_tenant         text,
    p_partition_ids  bigint[],
    p_hashes         uuid[],
    p_txn_ids        text[],
    p_lease_ids      uuid[],
    p_groups         text[],
    p_statuses       text[],
    p_errors         text[],
    p_now            timestamptz DEFAULT NULL
) RETURNS TABLE (idx integer, success boolean, error text, lease_released boolean, dlq boolean,
                 noop boolean)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$  -- see queen._ack_settle
DECLARE
    a record;
BEGIN
    SELECT * INTO a FROM queen._ack_settle(p_tenant, p_partition_ids, p_hashes, p_txn_ids, p_lease_ids, p_groups,
                                           p_statuses, p_errors, p_now);
    RETURN QUERY
    -- joins, not `= ANY`/array_position per item: those are quadratic in a batch of refused items
    -- (each index is at most once in each array: no row is repeated)
    SELECT g.i, e.i IS NULL, e.err, rl.i IS NOT NULL, d.i IS NOT NULL, nn.i IS NOT NULL
      FROM generate_series(1, coalesce(cardinality(p_partition_ids), 0)) AS g(i)
      LEFT JOIN unnest(a.o_refused, a.o_errors) AS e(i, err) ON e.i = g.i
      LEFT JOIN unnest(a.o_released) AS rl(i) ON rl.i = g.i
      LEFT JOIN unnest(a.o_dlq) AS d(i) ON d.i = g.i
      LEFT JOIN unnest(a.o_noop) AS nn(i) ON nn.i = g.i
     ORDER BY g.i;
END;
$$;

-- queen.ack_v3: the broker's ack call (POST /api/v1/ack, /ack/batch: queen_pg/engine/ack.py). The items
-- come packed, so the driver encodes a few values instead of seven 100-element arrays:
--   p_items   n × 26 bytes: xxh3-128 of the transactionId (16) | kind u16 | txn start u32 | txn len u32
--             (little-endian; start/len are bytes of p_txns)
--   p_kind_*  the distinct (partition id, consumer group, lease id or NULL, status) of the items; an
--             item's kind is its 1-based index into them
--   p_txns    every item's transactionId as UTF-8, concatenated
--   p_errors  the items' error texts, or NULL when none has one
--   p_hint    NULL, or per kind (3 values each, in kind order; NULLs for a kind without) {lease start,
--             lowest offset, highest offset} when the kind is `completed` under a lease and the broker
--             resolved every one of its items from the lease it handed out (queen_pg/engine/leases.py): the start of the range whose every offset it knew
--             and the span of the items' offsets. That every item is one of those offsets is the
--             broker's word (it sends no hint for an item it did not lease); the rest is checked here:
--             queen._ack_settle uses the hint only with the cursor inside the range, the lease live,
--             no passed-over offsets and the segments still there; else the hashes are looked up as
--             without it. Same verdicts either way (tests/test_ack_hint.py).
-- Result, rules and locks: queen._ack_settle's (one row of sparse verdicts), plus o_wake: the queues in
-- which the call left a cursor row claimable (queen._ack_wakes; the fast path: its row released with
-- messages left), whose parked pops the broker wakes. The clock is read there,
-- after each cursor row's lock. Decoded here: the kinds when there are several, and the hashes unless
-- a hint may spare them (then queen._ack_settle decodes them if it looks them up after all); the
-- transactionIds only when a cursor row's items are judged one by one (queen._ack_txns).
CREATE OR REPLACE FUNCTION queen.ack_v3(
    p_tenant        text,
    p_items         bytea,
    p_kind_pids     bigint[],
    p_kind_groups   text[],
    p_kind_leases   uuid[],
    p_kind_statuses text[],
    p_txns          bytea,
    p_errors        text[],
    p_now           timestamptz DEFAULT NULL,
    p_hint          bigint[] DEFAULT NULL
) RETURNS TABLE (o_refused integer[], o_errors text[], o_released integer[], o_dlq integer[],
                 o_noop integer[], o_wake text[])
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$  -- see queen._ack_settle
DECLARE
    v_n        integer;
    v_pids     bigint[];
    v_hashes   uuid[];
    v_leases   uuid[];
    v_groups   text[];
    v_statuses text[];
    v_hpids    bigint[];
    v_hgroups  text[];
    v_hkinds   integer[];
    f          record;
    v_now      timestamptz;
    v_c        record;     -- queen._ack_commit's answer: (released, wake)
    v_k        integer;
    v_kn       integer := coalesce(cardinality(p_kind_pids), 0);
    v_ok       boolean;
    v_relk     integer[];  -- the several-kinds fast path: the kinds whose lease it released
BEGIN
    IF length(p_items) % 26 <> 0 THEN
        RAISE EXCEPTION 'queen.ack_v3: p_items holds % bytes, not whole 26-byte items', length(p_items);
    END IF;
    v_n := length(p_items) / 26;
    -- Fast path (the usual ack: one kind, `completed` under a lease, with its hint): queen._ack_settle's
    -- hinted range ack (its step 0, the same checks and the same row and answer) in three statements
    -- instead of about ten: lock the cursor row, read the clock, check what needs a look (no passed-over
    -- offsets, the segment holding the hint's lowest offset still there), then commit through the hint's
    -- highest offset (queen._ack_commit). Whatever it cannot decide goes on to queen._ack_settle, which
    -- finds the row this call already holds (tests/test_ack_hint.py compares both ways).
    IF p_hint[3] IS NOT NULL AND v_n > 0 AND cardinality(p_kind_pids) = 1
       AND p_kind_statuses[1] = 'completed' AND p_kind_leases[1] IS NOT NULL THEN
        SELECT lc.cursor_offset, lc.lease_id, lc.lease_expires_at, lc.lease_end INTO f
          FROM queen.log_consumers lc
          JOIN queen.log_partitions p ON p.id = lc.partition_id
         WHERE lc.partition_id = p_kind_pids[1] AND lc.consumer_group = p_kind_groups[1] AND p.tenant = p_tenant
           FOR UPDATE OF lc;
        v_now := coalesce(p_now, clock_timestamp());  -- after the row lock: the lease is judged now
        IF f.lease_id = p_kind_leases[1] AND f.lease_expires_at > v_now
           AND p_hint[1] <= f.cursor_offset AND p_hint[2] >= f.cursor_offset AND p_hint[3] < f.lease_end THEN
            -- (the segment holding p_hint[2]: the newest starting at or below it, one index probe)
            IF NOT EXISTS (SELECT 1 FROM queen.log_passes ps
                            WHERE ps.partition_id = p_kind_pids[1] AND ps.consumer_group = p_kind_groups[1])
               AND (SELECT s.end_offset FROM queen.log_segments s
                     WHERE s.partition_id = p_kind_pids[1] AND s.base_offset <= p_hint[2]
                     ORDER BY s.base_offset DESC LIMIT 1) > p_hint[2] THEN
                v_c := queen._ack_commit(p_kind_pids[1], p_kind_groups[1], p_hint[3] + 1, NULL, true, false,
                                         NULL, NULL);
                o_refused := '{}';
                o_errors := '{}';
                o_released := CASE WHEN v_c.released THEN ARRAY[v_n] ELSE '{}'::integer[] END;
                o_dlq := '{}';
                o_noop := '{}';
                o_wake := CASE WHEN v_c.wake IS NULL THEN '{}'::text[] ELSE ARRAY[v_c.wake] END;
                RETURN NEXT;
                RETURN;
            END IF;
        END IF;
    END IF;
    -- Fast path, several kinds (fused requests of different leases, engine/fusion.py): the one-kind
    -- path's checks for every cursor row at once, then queen._ack_commit for each row: three statements
    -- and a commit a row instead of queen._ack_settle's loop (~10 statements a row). It applies when
    -- every kind is `completed` under a lease, with its hint, and no two kinds share a cursor row. The rows are locked in
    -- queen._ack_settle's order (ascending partition, group: docs/architecture.md#lock-order #3); when any row fails a
    -- check nothing is written here and every row goes on to queen._ack_settle, which finds the rows
    -- this call already holds (tests/test_ack_hint.py compares both ways).
    IF p_hint IS NOT NULL AND v_n > 0 AND v_kn > 1 AND cardinality(p_hint) = 3 * v_kn
       AND NOT EXISTS (SELECT 1 FROM generate_subscripts(p_kind_pids, 1) AS k(k)
                        WHERE p_kind_statuses[k.k] IS DISTINCT FROM 'completed' OR p_kind_leases[k.k] IS NULL
                           OR p_hint[3 * k.k - 2] IS NULL OR p_hint[3 * k.k - 1] IS NULL OR p_hint[3 * k.k] IS NULL)
       AND (SELECT count(DISTINCT (x.pid, x.grp)) FROM unnest(p_kind_pids, p_kind_groups) AS x(pid, grp)) = v_kn THEN
        PERFORM 1
           FROM queen.log_consumers lc
           JOIN queen.log_partitions p ON p.id = lc.partition_id
           JOIN unnest(p_kind_pids, p_kind_groups) AS x(pid, grp)
             ON lc.partition_id = x.pid AND lc.consumer_group = x.grp
          WHERE p.tenant = p_tenant
          ORDER BY lc.partition_id, lc.consumer_group
            FOR UPDATE OF lc;
        v_now := coalesce(p_now, clock_timestamp());  -- after the row locks: the leases are judged now
        SELECT count(*) FILTER (WHERE c.ok) = v_kn INTO v_ok
          FROM (SELECT lc.lease_id = p_kind_leases[x.k] AND lc.lease_expires_at > v_now
                       AND p_hint[3 * x.k - 2] <= lc.cursor_offset AND p_hint[3 * x.k - 1] >= lc.cursor_offset
                       AND p_hint[3 * x.k] < lc.lease_end
                       AND NOT EXISTS (SELECT 1 FROM queen.log_passes ps
                                        WHERE ps.partition_id = x.pid AND ps.consumer_group = x.grp)
                       AND (SELECT s.end_offset FROM queen.log_segments s
                             WHERE s.partition_id = x.pid AND s.base_offset <= p_hint[3 * x.k - 1]
                             ORDER BY s.base_offset DESC LIMIT 1) > p_hint[3 * x.k - 1] AS ok
                  FROM unnest(p_kind_pids, p_kind_groups) WITH ORDINALITY AS x(pid, grp, k)
                  JOIN queen.log_consumers lc ON lc.partition_id = x.pid AND lc.consumer_group = x.grp
                  JOIN queen.log_partitions p ON p.id = lc.partition_id AND p.tenant = p_tenant) AS c;
        IF v_ok THEN
            v_relk := '{}';
            o_wake := '{}';
            FOR v_k IN 1 .. v_kn LOOP  -- (kind order; every row is held already)
                v_c := queen._ack_commit(p_kind_pids[v_k], p_kind_groups[v_k], p_hint[3 * v_k] + 1, NULL, true,
                                         false, NULL, NULL);
                IF v_c.released THEN
                    v_relk := v_relk || v_k;
                END IF;
                IF v_c.wake IS NOT NULL AND NOT v_c.wake = ANY (o_wake) THEN
                    o_wake := o_wake || v_c.wake;
                END IF;
            END LOOP;
            IF cardinality(o_wake) > 1 THEN  -- sorted, as an array_agg(DISTINCT) gives them
                o_wake := ARRAY(SELECT w.w FROM unnest(o_wake) AS w(w) ORDER BY w.w);
            END IF;
            o_refused := '{}';
            o_errors := '{}';
            o_dlq := '{}';
            o_noop := '{}';
            -- leaseReleased is reported on each released row's last item (as queen._ack_settle does)
            SELECT coalesce(array_agg(m.last ORDER BY m.last), '{}') INTO o_released
              FROM (SELECT max(i.i) + 1 AS last
                      FROM generate_series(0, v_n - 1) AS i(i)
                     WHERE cardinality(v_relk) > 0
                       AND get_byte(p_items, i.i * 26 + 16) + (get_byte(p_items, i.i * 26 + 17) << 8) = ANY (v_relk)
                     GROUP BY get_byte(p_items, i.i * 26 + 16) + (get_byte(p_items, i.i * 26 + 17) << 8)) AS m;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    IF p_hint IS NULL THEN
        v_hashes := queen._ack_hashes(p_items);
    ELSIF cardinality(p_kind_pids) = 1 THEN  -- (else queen._ack_settle decodes them when it looks them up)
        v_hpids := p_kind_pids;
        v_hgroups := p_kind_groups;
        v_hkinds := ARRAY[1];
    ELSE  -- fused requests: a kind's hint holds for its cursor row when no other kind shares the row
        SELECT array_agg(u.pid), array_agg(u.grp), array_agg(u.k::integer)
          INTO v_hpids, v_hgroups, v_hkinds
          FROM (SELECT x.pid, x.grp, x.k, count(*) OVER (PARTITION BY x.pid, x.grp) AS n
                  FROM unnest(p_kind_pids, p_kind_groups) WITH ORDINALITY AS x(pid, grp, k)) AS u
         WHERE u.n = 1 AND p_hint[(u.k - 1) * 3 + 3] IS NOT NULL;
    END IF;
    IF cardinality(p_kind_pids) = 1 THEN  -- the common call: one partition, group, lease and status
        v_pids := array_fill(p_kind_pids[1], ARRAY[v_n]);
        v_groups := array_fill(p_kind_groups[1], ARRAY[v_n]);
        v_leases := array_fill(p_kind_leases[1], ARRAY[v_n]);
        v_statuses := array_fill(p_kind_statuses[1], ARRAY[v_n]);
    ELSE
        -- (PostgreSQL's | and << share one precedence: the shift is parenthesized)
        SELECT coalesce(array_agg(p_kind_pids[x.k] ORDER BY x.i), '{}'),
               coalesce(array_agg(p_kind_groups[x.k] ORDER BY x.i), '{}'),
               coalesce(array_agg(p_kind_leases[x.k] ORDER BY x.i), '{}'),
               coalesce(array_agg(p_kind_statuses[x.k] ORDER BY x.i), '{}')
          INTO v_pids, v_groups, v_leases, v_statuses
          FROM (SELECT i, get_byte(p_items, i * 26 + 16) + (get_byte(p_items, i * 26 + 17) << 8) AS k
                  FROM generate_series(0, v_n - 1) AS i) AS x;
    END IF;
    RETURN QUERY
    SELECT a.o_refused, a.o_errors, a.o_released, a.o_dlq, a.o_noop,
           queen._ack_wakes(p_tenant, p_kind_pids, p_kind_groups, p_now)  -- (runs after _ack_settle)
      FROM queen._ack_settle(p_tenant, v_pids, v_hashes, NULL, v_leases, v_groups, v_statuses,
                             p_errors, p_now, p_items, p_txns, cardinality(p_kind_pids) = 1,
                             v_hpids, v_hgroups, v_hkinds, p_hint) AS a;
END;
$$;

-- queen.lease_extend_v1: renew every live lease under a lease id by its queue's leaseTime.
-- Called by: POST /api/v1/lease/{leaseId}/extend (queen_pg/engine/ack.py). Result: (renewed count,
-- new expiry or NULL).
-- Locks: (docs/architecture.md#lock-order #3) the lease's log_consumers rows FOR UPDATE in ascending (partition_id,
-- group) order, the order ack_v1, seek and group delete use (a multi-partition lease renewed while it
-- is acked must not take them the other way round); then the clock is read, after the last wait.
-- The lease's rows are found through queen.log_leases (lease id -> cursor rows, schema.sql), each
-- checked on the cursor row itself (lc.lease_id): log_consumers has no index on lease_id. Renewing
-- changes lease_expires_at only: a HOT update.
CREATE OR REPLACE FUNCTION queen.lease_extend_v1(p_tenant text, p_lease_id uuid, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (renewed integer, expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
BEGIN
    PERFORM 1 FROM queen.log_leases l
      JOIN queen.log_consumers lc
        ON lc.partition_id = l.partition_id AND lc.consumer_group = l.consumer_group
     WHERE l.lease_id = p_lease_id AND lc.lease_id = p_lease_id AND lc.tenant = p_tenant
     ORDER BY lc.partition_id, lc.consumer_group
       FOR UPDATE OF lc;
    v_now := coalesce(p_now, clock_timestamp());
    RETURN QUERY
    WITH upd AS (
        UPDATE queen.log_consumers lc
           SET lease_expires_at = v_now + make_interval(secs => greatest(q.lease_time, 1))
          FROM queen.log_leases l, queen.queues q
         WHERE l.lease_id = p_lease_id
           AND lc.partition_id = l.partition_id AND lc.consumer_group = l.consumer_group
           AND lc.lease_id = p_lease_id AND lc.lease_expires_at > v_now AND lc.tenant = p_tenant
           AND q.id = lc.queue_id
        RETURNING lc.lease_expires_at
    )
    SELECT count(*)::integer, max(upd.lease_expires_at) FROM upd;
END;
$$;
