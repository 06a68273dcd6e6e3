-- queen.pop_v1: claim up to p_max_partitions claimable partitions of a queue for a consumer group
-- and lease up to p_batch messages across them.
--
-- Called by: GET /api/v1/pop/queue/{queue}[/partition/{partition}] (queen_pg/engine/pop.py).
-- Inputs:  tenant, queue, partition (NULL = any), group ('__QUEUE_MODE__' for queue mode), batch,
--          max partitions, the lease id minted by the broker, auto_ack (at-most-once: the cursor moves
--          at once and no lease is kept), the subscription mode/from used when the group is new.
-- Result:  one row per segment that overlaps a claimed range, claims in claim order, segments in
--          offset order: partition id and name, the leased range [lease_start, lease_end), the
--          redelivery boundary (messages below redelivered_end were delivered before and now count
--          `attempts`; the others are attempt 1), offsets already acked out of order (skip them),
--          the lease expiry, and the segment (base_offset, end_offset, created_at, dropped, payload).
--          No rows = nothing claimable (or no such queue).
-- Locks:   (docs/locks.md) the queue row FOR UPDATE only when the group is new (queen._create_group);
--          log_consumers rows FOR UPDATE SKIP LOCKED, so concurrent pops never wait on each other.
-- Claim order: the partition whose oldest pending message is oldest first (time of the segment
--          holding the cursor).
-- Guarantees: a partition is leased to at most one holder at a time per group; an expired lease is
--          claimable again and its range counts one more delivery attempt.

CREATE OR REPLACE FUNCTION queen.pop_v1(
    p_tenant          text,
    p_queue           text,
    p_partition       text,
    p_group           text,
    p_batch           integer,
    p_max_partitions  integer,
    p_lease_id        uuid,
    p_auto_ack        boolean,
    p_sub_mode        text,
    p_sub_from        timestamptz,
    p_now             timestamptz DEFAULT NULL
) RETURNS TABLE (partition_id bigint, partition_name text, lease_start bigint, lease_end bigint,
                 redelivered_end bigint, attempts integer, acked bigint[], lease_expires_at timestamptz,
                 base_offset bigint, end_offset bigint, created_at timestamptz, dropped integer[],
                 payload bytea)
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_queue   queen.queues%ROWTYPE;
    v_budget  integer := greatest(p_batch, 1);
    v_take    bigint;
    v_end     bigint;
    v_attempt integer;
    v_expires timestamptz;
    c         record;
BEGIN
    SELECT * INTO v_queue FROM queen.queues q WHERE q.tenant = p_tenant AND q.name = p_queue;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM queen.log_groups g WHERE g.queue_id = v_queue.id AND g.name = p_group) THEN
        PERFORM queen._create_group(v_queue.id, p_tenant, p_group, p_sub_mode, p_sub_from, v_now);
    END IF;
    v_expires := v_now + make_interval(secs => greatest(v_queue.lease_time, 1));

    FOR c IN
        SELECT lc.partition_id, lc.cursor_offset, lc.acked, lc.delivered_end, lc.attempts AS old_attempts,
               p.name AS pname, p.next_offset
          FROM queen.log_consumers lc
          JOIN queen.log_partitions p ON p.id = lc.partition_id
         WHERE lc.queue_id = v_queue.id
           AND lc.consumer_group = p_group
           AND (p_partition IS NULL OR p.name = p_partition)
           AND lc.cursor_offset < p.next_offset
           AND (lc.lease_id IS NULL OR lc.lease_expires_at <= v_now)
         ORDER BY (SELECT s.created_at FROM queen.log_segments s
                    WHERE s.partition_id = lc.partition_id AND s.base_offset <= lc.cursor_offset
                    ORDER BY s.base_offset DESC LIMIT 1) NULLS FIRST,
                  lc.partition_id
         LIMIT greatest(p_max_partitions, 1)
           FOR UPDATE OF lc SKIP LOCKED
    LOOP
        v_take := least(v_budget, c.next_offset - c.cursor_offset);
        v_end := c.cursor_offset + v_take;
        v_attempt := CASE WHEN c.cursor_offset < c.delivered_end THEN c.old_attempts + 1 ELSE 1 END;
        IF p_auto_ack THEN
            UPDATE queen.log_consumers lc
               SET cursor_offset = v_end,
                   acked = ARRAY(SELECT a FROM unnest(lc.acked) AS a WHERE a >= v_end ORDER BY a),
                   delivered_end = greatest(lc.delivered_end, v_end),
                   attempts = 0, fail_offset = NULL, failures = 0,
                   acked_total = lc.acked_total + v_take,
                   lease_id = NULL, lease_expires_at = NULL, lease_end = NULL,
                   claimed_at = v_now
             WHERE lc.partition_id = c.partition_id AND lc.consumer_group = p_group;
        ELSE
            UPDATE queen.log_consumers lc
               SET lease_id = p_lease_id, lease_expires_at = v_expires, lease_end = v_end,
                   attempts = v_attempt,
                   delivered_end = greatest(lc.delivered_end, v_end),
                   claimed_at = v_now
             WHERE lc.partition_id = c.partition_id AND lc.consumer_group = p_group;
        END IF;

        RETURN QUERY
        SELECT c.partition_id, c.pname, c.cursor_offset, v_end,
               least(c.delivered_end, v_end), v_attempt, c.acked,
               CASE WHEN p_auto_ack THEN NULL ELSE v_expires END,
               s.base_offset, s.end_offset, s.created_at, s.dropped, s.payload
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
