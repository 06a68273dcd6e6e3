-- queen.pop_v1: claim up to p_max_partitions claimable partitions for a consumer group and lease up
-- to p_batch messages across them.
--
-- Called by: GET /api/v1/pop/queue/{queue}[/partition/{partition}] and GET /api/v1/pop?namespace=&task=
--          (queen_pg/engine/pop.py).
-- Inputs:  tenant; either a queue name, or (queue NULL) a namespace and/or task selecting every queue
--          tagged so; partition (NULL = any); group ('__QUEUE_MODE__' for queue mode); batch; max
--          partitions; the lease id minted by the broker; auto_ack (at-most-once: the cursor moves at
--          once and no lease is kept); the subscription mode/from used when the group is new on a queue
--          (the broker normalizes the mode, WIRE §9.2: 'all' | 'new' | 'from' with p_sub_from);
--          p_lease_seconds (NULL = the queue's leaseTime): this claim's lease length (WIRE §9.3).
-- Result:  one row per segment that overlaps a claimed range, claims in claim order, segments in
--          offset order: queue and partition, the leased range [lease_start, lease_end), the
--          redelivery boundary (messages below redelivered_end were delivered before and now count
--          `attempts`; the others are attempt 1), `acked`: offsets of the range this group passes over
--          (queen.log_passes: skip them), the lease expiry, and the segment (base_offset, end_offset, created_at, dropped, payload).
--          No rows = nothing claimable (or no such queue).
-- Claimable: cursor below next_offset; no live lease; the message at the cursor is older than the
--          queue's delayedProcessing; the partition has been quiet for the queue's windowBuffer. A
--          claim never includes messages younger than delayedProcessing.
-- Claim order: oldest pending message first (time of the segment holding the cursor).
-- Locks:   (docs/locks.md) the queue row FOR UPDATE only when the group is new on it
--          (queen._create_group); log_consumers rows FOR UPDATE SKIP LOCKED, so concurrent pops never
--          wait on each other. The clock is read after the last lock wait (the group creation).
--          A claimed cursor first passes over its log_passes offsets (queen._pass_over, 040_ack.sql).
-- Guarantees: a partition is leased to at most one holder at a time per group; an expired lease is
--          claimable again and its range counts one more delivery attempt.

DROP FUNCTION IF EXISTS queen.pop_v1(text, text, text, text, integer, integer, uuid, boolean, text,
                                     timestamptz, timestamptz);
-- p_lease_seconds was added as a trailing parameter (callers that pass p_now positionally keep working);
-- the 13-argument form would make 12- and 13-argument calls ambiguous, so it goes.
DROP FUNCTION IF EXISTS queen.pop_v1(text, text, text, text, text, text, integer, integer, uuid, boolean, text,
                                     timestamptz, timestamptz);

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
BEGIN
    SELECT array_agg(qq.id ORDER BY qq.id) INTO v_qids
      FROM queen.queues qq
     WHERE qq.tenant = p_tenant
       AND CASE WHEN p_queue IS NOT NULL THEN qq.name = p_queue
                ELSE (p_namespace IS NULL OR qq.namespace = p_namespace)
                 AND (p_task IS NULL OR qq.task = p_task)
                 AND (p_namespace IS NOT NULL OR p_task IS NOT NULL) END;
    IF v_qids IS NULL THEN
        RETURN;
    END IF;
    FOR q IN SELECT u.id FROM unnest(v_qids) AS u(id)
              WHERE NOT EXISTS (SELECT 1 FROM queen.log_groups g WHERE g.queue_id = u.id AND g.name = p_group)
    LOOP
        PERFORM queen._create_group(q.id, p_tenant, p_group, p_sub_mode, p_sub_from, p_now);
    END LOOP;
    v_now := coalesce(p_now, clock_timestamp());  -- after the last lock wait (_create_group)

    FOR c IN
        SELECT lc.partition_id, lc.cursor_offset, lc.delivered_end, lc.attempts AS old_attempts,
               p.name AS pname, p.next_offset, qq.name AS qname, qq.lease_time, qq.delayed_processing
          FROM queen.log_consumers lc
          JOIN queen.log_partitions p ON p.id = lc.partition_id
          JOIN queen.queues qq ON qq.id = lc.queue_id
          LEFT JOIN LATERAL (
                SELECT s.created_at AS head_at FROM queen.log_segments s
                 WHERE s.partition_id = lc.partition_id AND s.base_offset <= lc.cursor_offset
                 ORDER BY s.base_offset DESC LIMIT 1) h ON true
         WHERE lc.queue_id = ANY (v_qids)
           AND lc.consumer_group = p_group
           AND (p_partition IS NULL OR p.name = p_partition)
           AND lc.cursor_offset < p.next_offset
           AND (lc.lease_id IS NULL OR lc.lease_expires_at <= v_now)
           AND (qq.delayed_processing = 0
                OR h.head_at <= v_now - make_interval(secs => qq.delayed_processing))
           AND (qq.window_buffer = 0
                OR p.last_write_at <= v_now - make_interval(secs => qq.window_buffer))
         ORDER BY h.head_at NULLS FIRST, lc.partition_id
         LIMIT greatest(p_max_partitions, 1)
           FOR UPDATE OF lc SKIP LOCKED
    LOOP
        c.cursor_offset := queen._pass_over(c.partition_id, p_group, c.cursor_offset);
        IF c.cursor_offset >= c.next_offset THEN  -- nothing left for this group but passed-over offsets
            UPDATE queen.log_consumers lc SET cursor_offset = c.cursor_offset
             WHERE lc.partition_id = c.partition_id AND lc.consumer_group = p_group;
            CONTINUE;
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
        IF p_auto_ack THEN
            UPDATE queen.log_consumers lc
               SET cursor_offset = v_end,
                   delivered_end = greatest(lc.delivered_end, v_end),
                   attempts = 0, fail_offset = NULL, failures = 0,
                   acked_total = lc.acked_total + v_take,
                   lease_id = NULL, lease_expires_at = NULL, lease_end = NULL,
                   claimed_at = v_now
             WHERE lc.partition_id = c.partition_id AND lc.consumer_group = p_group;
        ELSE
            UPDATE queen.log_consumers lc
               SET cursor_offset = c.cursor_offset,
                   lease_id = p_lease_id, lease_expires_at = v_expires, lease_end = v_end,
                   attempts = v_attempt,
                   delivered_end = greatest(lc.delivered_end, v_end),
                   claimed_at = v_now
             WHERE lc.partition_id = c.partition_id AND lc.consumer_group = p_group;
        END IF;

        RETURN QUERY
        SELECT c.qname, c.partition_id, c.pname, c.cursor_offset, v_end,
               least(c.delivered_end, v_end), v_attempt,
               ARRAY(SELECT lp.msg_offset FROM queen.log_passes lp
                      WHERE lp.partition_id = c.partition_id AND lp.consumer_group = p_group
                        AND lp.msg_offset >= c.cursor_offset AND lp.msg_offset < v_end ORDER BY 1),
               CASE WHEN p_auto_ack THEN NULL ELSE v_expires END,
               s.base_offset, s.end_offset, s.created_at, s.dropped, s.codec, s.payload
          FROM queen.log_segments s
         WHERE s.partition_id = c.partition_id
           AND s.base_offset >= coalesce((SELECT max(s2.base_offset) FROM queen.log_segments s2
                                           WHERE s2.partition_id = c.partition_id
                                             AND s2.base_offset <= c.cursor_offset), 0)
           AND s.base_offset < v_end
         ORDER BY s.base_offset;

        v_budget := v_budget - v_take::integer;
        EXIT WHEN v_budget <= 0;
    END LOOP;
END;
$$;
