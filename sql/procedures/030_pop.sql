-- queen.pop_v1: claim up to p_max_partitions claimable partitions for a consumer group and lease up
-- to p_batch messages across them.
--
-- Called by: GET /api/v1/pop/queue/{queue}[/partition/{partition}] and GET /api/v1/pop?namespace=&task=
--          (queen_pg/engine/pop.py).
-- Inputs:  tenant; either a queue name, or (queue NULL) a namespace and/or task selecting every queue
--          tagged so; partition (NULL = any); group ('__QUEUE_MODE__' for queue mode); batch; max
--          partitions; the lease id minted by the broker; auto_ack (at-most-once: the cursor moves at
--          once and no lease is kept); the subscription mode/from used when the group is new on a queue
--          (the broker normalizes the mode, docs/wire.md#subscription: 'all' | 'new' | 'from' with p_sub_from);
--          p_lease_seconds (NULL = the queue's leaseTime): this claim's lease length (docs/wire.md#lease-seconds).
-- Result:  one row per segment that overlaps a claimed range, claims in claim order, segments in
--          offset order: queue and partition, the leased range [lease_start, lease_end), the
--          redelivery boundary (messages below redelivered_end were delivered before and now count
--          `attempts`; the others are attempt 1), `acked`: offsets of the range this group passes over
--          (queen.log_passes: skip them), the lease expiry, and the segment (base_offset, end_offset, created_at, dropped, payload).
--          No rows = nothing claimable (or no such queue).
-- Claimable: cursor below next_offset; no live lease; the message at the cursor is older than the
--          queue's delayedProcessing; the partition has been quiet for the queue's windowBuffer. A
--          claim never includes messages younger than delayedProcessing.
-- Claim order: oldest pending message first (time of the segment holding the cursor: the cursor row's
--          head_at, kept by queen._cursor_head and queen._wake_cursors, 001_internal.sql).
-- Cost:    discovery reads log_consumers_ready_idx from the group's oldest head on: it visits the rows
--          it claims, rows other pops hold, and rows under a live lease or a windowBuffer, never the
--          caught-up ones nor the rest of the pending ones (tests/test_pop_discovery.py guards it).
--          Across queues (namespace/task) the candidates are each queue's oldest few heads; when none
--          of them is claimable (windowBuffer, other pops hold them) and the list was cut, it looks
--          eight times further, and so on: an older-headed queue never hides another's messages.
-- Locks:   (docs/architecture.md#lock-order) the queue row FOR UPDATE only when the group is new on it
--          (queen._create_group); log_consumers rows FOR UPDATE SKIP LOCKED, so concurrent pops never
--          wait on each other; a cursor that moves tries its partition row FOR SHARE SKIP LOCKED
--          (queen._cursor_head: never waits). The clock is read after the last lock wait (the group
--          creation).
--          A claimed cursor first passes over its log_passes offsets (queen._pass_over, 040_ack.sql).
--          A leased claim inserts its queen.log_leases row (lease id -> cursor row) in the same
--          statement, under the cursor row it holds; no other lock (the row's key is new: lease ids are
--          minted per pop). The claim changes no indexed column of log_consumers: a HOT update.
-- Fast path: the usual pop (a queue named, no partition, max partitions 1, an existing group, a queue
--          without delayedProcessing/windowBuffer) runs two statements: discovery + lock of the oldest
--          claimable cursor row (as the one-queue discovery), then, in a snapshot taken after that lock,
--          the claim and its segments in one statement; an idle pop runs the first only. A row with
--          passed-over offsets (log_passes) or found stale, and every other shape, take the general
--          path (~8 statements). Same answers and rows (tests/test_pop_fast.py compares both paths).
--          The claim (the cursor row's lease or auto-ack, its log_leases row, the segments) is ONE
--          statement that both paths run, written once (tests/test_pop_fast.py holds it so).
-- Plans:   the default plan_cache_mode (auto): PL/pgSQL already plans the discovery and the claim
--          generically after five calls (forcing measured equal). The lookup by queue name is its own
--          statement so that its generic plan reads the (tenant, name) key (one statement with a CASE
--          had none: re-planned on every pop, -16..-20 % pop CPU with 20,000 queues; plans.md notes).
-- Guarantees: a partition is leased to at most one holder at a time per group; an expired lease is
--          claimable again and its range counts one more delivery attempt.

CREATE OR REPLACE FUNCTION queen.pop_v1(
    p_tenant          text,
    p_queue           text,
    p_namespace       text,
    p_task            text,
    p_partition       text,
    p_group           text,
    p_batch           integer,
    p_max_partitions  integer,
    p_lease_id        uuid,
    p_auto_ack        boolean,
    p_sub_mode        text,
    p_sub_from        timestamptz,
    p_now             timestamptz DEFAULT NULL,
    p_lease_seconds   integer DEFAULT NULL
) RETURNS TABLE (queue_name text, partition_id bigint, partition_name text, lease_start bigint,
                 lease_end bigint, redelivered_end bigint, attempts integer, acked bigint[],
                 lease_expires_at timestamptz, base_offset bigint, end_offset bigint,
                 created_at timestamptz, dropped integer[], codec smallint, payload bytea)
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz;
    v_qids    bigint[];
    v_budget  integer := greatest(p_batch, 1);
    v_take    bigint;
    v_end     bigint;
    v_young   bigint;
    v_attempt integer;
    v_expires timestamptz;
    q         record;
    c         record;
    v_cur     refcursor;
    v_cands   bigint[];
    v_want    integer;
    v_delay   integer;
    v_stale   integer;
    v_claimed integer := 0;
    v_pass    integer := 0;
    v_span    bigint;
    v_fast    boolean := false;
    v_passed  bigint[] := '{}';
    v_rows    bigint;
BEGIN
    -- Fast path (the usual pop: a queue named, no partition, one partition, an existing group, no
    -- delayedProcessing/windowBuffer; leased or auto-ack): two statements instead of ~8. The first finds the
    -- queue, checks the group and the queue's options, and discovers and locks the oldest claimable
    -- cursor row (the same discovery as below, through log_consumers_ready_idx); the second, in a
    -- snapshot taken after that lock, is the claim below (one statement for both paths), which leases
    -- the row unless the group passes over offsets in the partition (queen.log_passes) and returns its
    -- segments. Anything else (no such queue or group, options, a stale row, passed-over offsets) goes on
    -- to the general path, which re-finds a row this call already locked (SKIP LOCKED skips only other
    -- transactions' locks).
    -- (SET queen.pop_fast = 'off' turns it off for a session: tests/test_pop_fast.py compares both paths)
    IF p_queue IS NOT NULL AND p_partition IS NULL AND p_max_partitions <= 1
       AND current_setting('queen.pop_fast', true) IS DISTINCT FROM 'off' THEN
        v_now := coalesce(p_now, clock_timestamp());  -- no lock wait before or in the fast path
        -- discovery:fast (tests/test_pop_discovery.py EXPLAINs this statement)
        WITH fq AS (
            SELECT qq.id, qq.name, qq.lease_time,
                   qq.delayed_processing = 0 AND qq.window_buffer = 0
                   AND EXISTS (SELECT 1 FROM queen.log_groups g WHERE g.queue_id = qq.id AND g.name = p_group) AS fast
              FROM queen.queues qq WHERE qq.tenant = p_tenant AND qq.name = p_queue
        ), fc AS (
            SELECT lc.partition_id, lc.cursor_offset, lc.delivered_end, lc.attempts AS old_attempts,
                   p.name AS pname, p.next_offset
              FROM queen.log_consumers lc
              JOIN queen.log_partitions p ON p.id = lc.partition_id
             WHERE lc.queue_id = (SELECT fq.id FROM fq WHERE fq.fast)
               AND lc.consumer_group = p_group
               AND lc.head_at <= 'infinity'::timestamptz
               AND (lc.lease_id IS NULL OR lc.lease_expires_at <= v_now)
             ORDER BY lc.head_at, lc.partition_id
             LIMIT 1
               FOR UPDATE OF lc SKIP LOCKED
        )
        SELECT fc.partition_id, fc.cursor_offset, fc.delivered_end, fc.old_attempts, fc.pname, fc.next_offset,
               fq.name AS qname, fq.lease_time, 0 AS delayed_processing, fq.fast
          INTO c  -- the row the claim below reads (the general path's cursor fills it otherwise)
          FROM fq LEFT JOIN fc ON true;
        IF c.fast AND c.partition_id IS NULL THEN
            RETURN;  -- nothing claimable (the general path's discovery would find nothing either)
        END IF;
        v_fast := coalesce(c.fast AND c.cursor_offset < c.next_offset, false);
    END IF;

    -- Discovery (log_consumers_ready_idx): the group's rows with a pending head, oldest head first,
    -- never visiting caught-up rows. One queue: an ordered scan of the index, the rows locked SKIP
    -- LOCKED under the LIMIT (so rows other pops hold are passed, not counted). A named partition or
    -- several queues: the candidates first (the partition by its key; per queue, the oldest few by the
    -- index), then the same lock over them. The fast path's row comes first when there is one.
    <<discover>>
    LOOP
        IF NOT v_fast AND v_qids IS NULL THEN  -- the general path, once: the queues and the groups
            -- two statements, not one with a CASE: each has a generic plan on its key, so PL/pgSQL need not
            -- plan the lookup again on every pop in a tenant with many queues
            IF p_queue IS NOT NULL THEN
                SELECT array_agg(qq.id) INTO v_qids
                  FROM queen.queues qq WHERE qq.tenant = p_tenant AND qq.name = p_queue;
            ELSE
                SELECT array_agg(qq.id ORDER BY qq.id) INTO v_qids
                  FROM queen.queues qq
                 WHERE qq.tenant = p_tenant
                   AND (p_namespace IS NULL OR qq.namespace = p_namespace)
                   AND (p_task IS NULL OR qq.task = p_task)
                   AND (p_namespace IS NOT NULL OR p_task IS NOT NULL);
            END IF;
            IF v_qids IS NULL THEN
                RETURN;
            END IF;
            FOR q IN SELECT u.id FROM unnest(v_qids) AS u(id)
                      WHERE NOT EXISTS (SELECT 1 FROM queen.log_groups g WHERE g.queue_id = u.id AND g.name = p_group)
            LOOP
                PERFORM queen._create_group(q.id, p_tenant, p_group, p_sub_mode, p_sub_from, p_now);
            END LOOP;
            v_now := coalesce(p_now, clock_timestamp());  -- after the last lock wait (_create_group)
            v_want := greatest(p_max_partitions, 1);
            v_span := v_want + 32;
        END IF;
        v_cands := NULL;
        IF v_fast THEN
            NULL;  -- the fast path's row: no cursor
        ELSIF p_partition IS NOT NULL THEN
            v_cands := ARRAY(SELECT lp.id FROM queen.log_partitions lp
                              WHERE lp.queue_id = ANY (v_qids) AND lp.name = p_partition);
        ELSIF cardinality(v_qids) > 1 THEN
            v_cands := ARRAY(
                SELECT x.partition_id
                  FROM queen.queues qq
                 CROSS JOIN LATERAL (
                        SELECT lc.partition_id, lc.head_at FROM queen.log_consumers lc
                         WHERE lc.queue_id = qq.id AND lc.consumer_group = p_group
                           AND lc.head_at <= CASE WHEN qq.delayed_processing = 0 THEN 'infinity'::timestamptz
                                                  ELSE v_now - make_interval(secs => qq.delayed_processing) END
                           AND (lc.lease_id IS NULL OR lc.lease_expires_at <= v_now)
                         ORDER BY lc.head_at, lc.partition_id
                         LIMIT v_span) x
                 WHERE qq.id = ANY (v_qids)
                 ORDER BY x.head_at, x.partition_id
                 LIMIT v_span);
        END IF;
        IF v_fast THEN
            NULL;
        ELSIF v_cands IS NULL THEN
            SELECT qq.delayed_processing INTO v_delay FROM queen.queues qq WHERE qq.id = v_qids[1];
            -- discovery:one-queue (tests/test_pop_discovery.py EXPLAINs this statement)
            OPEN v_cur FOR
                SELECT lc.partition_id, lc.cursor_offset, lc.delivered_end, lc.attempts AS old_attempts,
                       p.name AS pname, p.next_offset, qq.name AS qname, qq.lease_time, qq.delayed_processing
                  FROM queen.log_consumers lc
                  JOIN queen.log_partitions p ON p.id = lc.partition_id
                  JOIN queen.queues qq ON qq.id = lc.queue_id
                 WHERE lc.queue_id = v_qids[1]
                   AND lc.consumer_group = p_group
                   AND lc.head_at <= CASE WHEN v_delay = 0 THEN 'infinity'::timestamptz
                                          ELSE v_now - make_interval(secs => v_delay) END
                   AND (lc.lease_id IS NULL OR lc.lease_expires_at <= v_now)
                   AND (qq.window_buffer = 0
                        OR p.last_write_at <= v_now - make_interval(secs => qq.window_buffer))
                 ORDER BY lc.head_at, lc.partition_id
                 LIMIT v_want
                   FOR UPDATE OF lc SKIP LOCKED;
        ELSE
            -- discovery:candidates: the one-queue statement's rows, found by their keys. The join is not a
            -- view the two share: FOR UPDATE OF a view locks the rows of every table in it, so a pop would
            -- hold the queue row (a concurrent pop on the queue would skip all its partitions) and skip a
            -- partition whose row a push holds; FOR UPDATE OF lc locks the cursor rows alone.
            OPEN v_cur FOR
                SELECT lc.partition_id, lc.cursor_offset, lc.delivered_end, lc.attempts AS old_attempts,
                       p.name AS pname, p.next_offset, qq.name AS qname, qq.lease_time, qq.delayed_processing
                  FROM queen.log_consumers lc
                  JOIN queen.log_partitions p ON p.id = lc.partition_id
                  JOIN queen.queues qq ON qq.id = lc.queue_id
                 WHERE lc.partition_id = ANY (v_cands)
                   AND lc.consumer_group = p_group
                   AND lc.head_at <= CASE WHEN qq.delayed_processing = 0 THEN 'infinity'::timestamptz
                                          ELSE v_now - make_interval(secs => qq.delayed_processing) END
                   AND (lc.lease_id IS NULL OR lc.lease_expires_at <= v_now)
                   AND (qq.window_buffer = 0
                        OR p.last_write_at <= v_now - make_interval(secs => qq.window_buffer))
                 ORDER BY lc.head_at, lc.partition_id
                 LIMIT v_want
                   FOR UPDATE OF lc SKIP LOCKED;
        END IF;
        v_stale := 0;
        LOOP
        IF NOT v_fast THEN  -- (on the fast path, c is the row the fast discovery locked)
            FETCH v_cur INTO c;
            EXIT WHEN NOT FOUND;
            c.cursor_offset := queen._pass_over(c.partition_id, p_group, c.cursor_offset);
            IF c.cursor_offset >= c.next_offset THEN
                -- nothing left for this group but passed-over offsets, or a head marked pending while a
                -- push was in flight that wrote nothing for it: caught up (or pending again)
                UPDATE queen.log_consumers lc
                   SET cursor_offset = c.cursor_offset,
                       head_at = queen._cursor_head(c.partition_id, c.cursor_offset)
                 WHERE lc.partition_id = c.partition_id AND lc.consumer_group = p_group;
                v_stale := v_stale + 1;
                CONTINUE;
            END IF;
        END IF;
        v_end := c.cursor_offset + least(v_budget, c.next_offset - c.cursor_offset);
        IF c.delayed_processing > 0 THEN
            -- stop before the first segment that is still too young
            SELECT min(s.base_offset) INTO v_young FROM queen.log_segments s
             WHERE s.partition_id = c.partition_id AND s.base_offset > c.cursor_offset
               AND s.base_offset < v_end
               AND s.created_at > v_now - make_interval(secs => c.delayed_processing);
            v_end := coalesce(v_young, v_end);
        END IF;
        v_take := v_end - c.cursor_offset;
        v_attempt := CASE WHEN c.cursor_offset < c.delivered_end THEN c.old_attempts + 1 ELSE 1 END;
        v_expires := v_now + make_interval(secs => greatest(coalesce(p_lease_seconds, c.lease_time), 1));
        IF NOT v_fast THEN  -- the offsets of the range the group passes over (none on the fast path)
            v_passed := ARRAY(SELECT lp.msg_offset FROM queen.log_passes lp
                               WHERE lp.partition_id = c.partition_id AND lp.consumer_group = p_group
                                 AND lp.msg_offset >= c.cursor_offset AND lp.msg_offset < v_end ORDER BY 1);
        END IF;

        -- The claim, written once for both paths: leased, the row takes the lease and the lease its
        -- queen.log_leases row (lease id -> cursor row); auto-ack (at-most-once), the cursor moves at
        -- once (the trigger keeps head_at) and no lease is kept. Then the segments of the range. On
        -- the fast path the row is claimed only when the group passes over no offset in the partition
        -- (the general path passed over them first: queen._pass_over above).
        RETURN QUERY
        WITH claim AS (
            UPDATE queen.log_consumers lc
               SET cursor_offset = CASE WHEN p_auto_ack THEN v_end ELSE c.cursor_offset END,
                   lease_id = CASE WHEN p_auto_ack THEN NULL ELSE p_lease_id END,
                   lease_expires_at = CASE WHEN p_auto_ack THEN NULL ELSE v_expires END,
                   lease_end = CASE WHEN p_auto_ack THEN NULL ELSE v_end END,
                   attempts = CASE WHEN p_auto_ack THEN 0 ELSE v_attempt END,
                   fail_offset = CASE WHEN p_auto_ack THEN NULL ELSE lc.fail_offset END,
                   failures = CASE WHEN p_auto_ack THEN 0 ELSE lc.failures END,
                   acked_total = lc.acked_total + CASE WHEN p_auto_ack THEN v_take ELSE 0 END,
                   delivered_end = greatest(lc.delivered_end, v_end),
                   claimed_at = v_now
             WHERE lc.partition_id = c.partition_id AND lc.consumer_group = p_group
               AND NOT EXISTS (SELECT 1 FROM queen.log_passes lp
                                WHERE v_fast AND lp.partition_id = c.partition_id AND lp.consumer_group = p_group)
            RETURNING lc.partition_id
        ), lease AS (  -- the lease by id (queen.log_leases, schema.sql), with the claim
            INSERT INTO queen.log_leases (lease_id, partition_id, consumer_group)
            SELECT p_lease_id, cl.partition_id, p_group FROM claim cl WHERE NOT p_auto_ack
        )
        SELECT c.qname, c.partition_id, c.pname, c.cursor_offset, v_end,
               least(c.delivered_end, v_end), v_attempt,
               v_passed,
               CASE WHEN p_auto_ack THEN NULL ELSE v_expires END,
               s.base_offset, s.end_offset, s.created_at, s.dropped, s.codec, s.payload
          FROM queen.log_segments s
         WHERE EXISTS (SELECT 1 FROM claim)
           AND s.partition_id = c.partition_id
           AND s.base_offset >= coalesce((SELECT max(s2.base_offset) FROM queen.log_segments s2
                                           WHERE s2.partition_id = c.partition_id
                                             AND s2.base_offset <= c.cursor_offset), 0)
           AND s.base_offset < v_end
         ORDER BY s.base_offset;

        IF v_fast THEN
            GET DIAGNOSTICS v_rows = ROW_COUNT;
            IF v_rows > 0 THEN
                RETURN;
            END IF;
            IF EXISTS (SELECT 1 FROM queen.log_consumers lc
                        WHERE lc.partition_id = c.partition_id AND lc.consumer_group = p_group
                          AND (lc.lease_id = p_lease_id OR (p_auto_ack AND lc.cursor_offset = v_end))) THEN
                RETURN;  -- claimed, but no segment rows (as the general path would answer)
            END IF;
            v_fast := false;  -- passed-over offsets in the partition: the general path
            CONTINUE discover;
        END IF;
        v_budget := v_budget - v_take::integer;
        v_claimed := v_claimed + 1;
        IF v_budget <= 0 THEN
            CLOSE v_cur;
            EXIT discover;
        END IF;
        END LOOP;
        CLOSE v_cur;
        EXIT discover WHEN v_claimed > 0;
        IF v_stale = 0 THEN
            -- several queues, nothing claimable among the candidates although the list was cut at
            -- v_span (their partitions wait out a windowBuffer, or other pops hold them): look further
            -- down the heads, so an older-headed queue never hides the others' claimable partitions
            EXIT discover WHEN p_partition IS NOT NULL OR cardinality(v_qids) = 1
                               OR cardinality(v_cands) < v_span;
            v_span := v_span * 8;
        ELSE
            -- only stale rows found (now fixed): look once more, a few times at most (a row a push
            -- holds is marked pending again)
            v_pass := v_pass + 1;
            EXIT discover WHEN v_pass >= 3;
        END IF;
    END LOOP;
END;
$$;


-- queen.pop_many_v1: several pops of one queue, each of its own consumer group, in one call (request
-- fusion: the pops of different groups that arrive together, typically woken together by a push).
--
-- Called by: queen_pg/engine/pop.py (pop_many), through the fuser's pop lane (queen_pg/engine/fusion.py).
-- Inputs:  tenant, the queue name; then one entry per member (parallel arrays, the member's pop_v1
--          arguments): partition (NULL = any), group, batch, max partitions, lease id, auto_ack,
--          subscription mode/from, lease seconds. The groups are distinct (the fuser never puts two pops
--          of one group in one call), so no member can take what another would have.
-- Result:  pop_v1's rows, each with `member` (1-based index of its member), members in order.
-- Locks:   (docs/architecture.md#lock-order) the groups new on the queue are created first, in name
--          order (queen._create_group: the queue row FOR UPDATE, #1), before any member locks a cursor
--          row (#3); then each member is pop_v1 (log_consumers rows FOR UPDATE SKIP LOCKED: never waits),
--          so a fused call takes the locks in the order its members would alone.
-- Guarantees: each member's answer is pop_v1's for it alone (same messages, leases and cursors): its
--          rows are its own group's, which no other member touches; a member's failure fails the call
--          (one transaction, nothing written) and the fuser then runs every member alone.

CREATE OR REPLACE FUNCTION queen.pop_many_v1(
    p_tenant          text,
    p_queue           text,
    p_partitions      text[],
    p_groups          text[],
    p_batches         integer[],
    p_max_partitions  integer[],
    p_lease_ids       uuid[],
    p_auto_acks       boolean[],
    p_sub_modes       text[],
    p_sub_froms       timestamptz[],
    p_lease_seconds   integer[]
) -- `member`, then pop_v1's columns (tests/test_fusion_pop.py holds them equal)
RETURNS TABLE (member integer, queue_name text, partition_id bigint, partition_name text,
               lease_start bigint, lease_end bigint, redelivered_end bigint, attempts integer, acked bigint[],
               lease_expires_at timestamptz, base_offset bigint, end_offset bigint, created_at timestamptz,
               dropped integer[], codec smallint, payload bytea)
LANGUAGE plpgsql AS $$
DECLARE
    v_qid bigint;
    i     integer;
BEGIN
    SELECT qq.id INTO v_qid FROM queen.queues qq WHERE qq.tenant = p_tenant AND qq.name = p_queue;
    IF v_qid IS NULL THEN
        RETURN;  -- no such queue: every member's pop_v1 answers nothing
    END IF;
    FOR i IN SELECT m.n::integer FROM unnest(p_groups) WITH ORDINALITY AS m(g, n)
              WHERE NOT EXISTS (SELECT 1 FROM queen.log_groups lg WHERE lg.queue_id = v_qid AND lg.name = m.g)
              ORDER BY m.g
    LOOP
        PERFORM queen._create_group(v_qid, p_tenant, p_groups[i], p_sub_modes[i], p_sub_froms[i], NULL);
    END LOOP;
    FOR i IN 1 .. cardinality(p_groups) LOOP
        RETURN QUERY
        SELECT i, p.*
          FROM queen.pop_v1(p_tenant, p_queue, NULL, NULL, p_partitions[i], p_groups[i], p_batches[i],
                            p_max_partitions[i], p_lease_ids[i], p_auto_acks[i], p_sub_modes[i], p_sub_froms[i],
                            NULL, p_lease_seconds[i]) AS p;
    END LOOP;
END;
$$;
