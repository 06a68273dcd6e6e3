-- Messages: browse a queue's log, read one message and its state per consumer group, delete one.
--
-- Payloads sit in log_segments as QPF1 frames (zstd, codec 1, or raw, codec 0) that SQL cannot read:
-- these procedures hand out the segments and the broker (queen_pg/engine/messages.py) decodes and
-- slices them. Message k of a segment (k counted over the frames NOT listed in `dropped`) has offset
-- base_offset + k.
--
-- queen.messages_list_v3(tenant, queue, partition, from_offset, to_offset, since, until, desc, group,
--                        limit, offset, status, now, max_bytes)
--   Called by: GET /api/v1/messages (queen_pg/engine/messages.py). Selects the retained messages of a
--   queue (one partition, or all) whose offset is in [from_offset, to_offset) (either bound NULL =
--   open) and whose segment was written in [since, until) (NULL = open), and, when `status` is given ('consumed' | 'leased' |
--   'pending' | 'dead'; it needs `group`, the route refuses it alone), whose state for that group is
--   `status`; orders them by (segment time, partition id, offset), ascending or (desc) descending, and
--   pages them with limit/offset (over the filtered set: total counts the matching messages only).
--   A message's state for the group (the same as message_get_v2's):
--   'dead' (a dead letter of the group for the offset), else 'consumed' (below the group's cursor on
--   the partition, or an offset it passes over in log_passes: an ack is an offset commit), else
--   'leased' (below the end of the partition's live lease), else 'pending' (also: no cursor yet).
--   Counting per segment: the offsets split by the cursor and the live lease end into three ranges
--   (consumed, leased, pending), corrected by the segment's few exceptions (its dead letters and
--   passes of the group), so the filter costs one look-up per segment, not one per message.
--   Result rows: status 'ok' | 'no_queue' | 'no_partition' | 'no_group'; total (matching messages);
--   then per segment holding part of the page, in page order: partition id and name, the segment
--   (base_offset, created_at, dropped, codec, payload), the part of it that matches [lo, hi), `skip`
--   = how many matching messages come before this segment in the chosen order (the broker decodes
--   [lo, hi), keeps the offsets whose state is `status` and counts from `skip`); and, when a group is
--   given, `states`: the state of every offset of [lo, hi) for it, one letter each ('d' dead, 'c'
--   consumed, 'l' leased, 'p' pending), the only place the broker learns a listed message's state.
--   A page past the end, or a refusal, is one row with NULL segment columns.
--   Cost: one pass over the index entries of the matching segments of the queue (for total and the
--   ordering; with `status`, plus the cursor row and the dead letters and passes of each segment),
--   then the payloads of the page's segments only.
--   The page's segments stop at the answer budget (queen_pg/engine/answers.py): a segment is handed
--   out only while the stored bytes of the page's segments before it are under max_bytes (the first
--   always; NULL = no limit), so a page never carries much more than the budget of segments. The
--   broker decodes them and stops its page where the decoded messages reach the budget (a zstd
--   segment is smaller stored than decoded).
--   Locks: none (reads).
--
-- queen.message_get_v2(tenant, partition_id, txn_hash, now)
--   Called by: GET /api/v1/messages/{partitionId}/{transactionId} (docs/wire.md#message-detail). Resolves the
--   transactionId hash in the partition (log_txns; a transactionId can name several messages, e.g. a
--   dead letter put back: the newest is read, `offsets` lists them all) and returns status 'ok' |
--   'no_partition' | 'no_message', the queue and partition names, the queue's namespace, task and
--   `queue_config` (jsonb {leaseTime, retryLimit, priority, delayedProcessing, windowBuffer, maxSize,
--   retentionSeconds, completedRetentionSeconds, dedupWindowSeconds, encryptionEnabled}), the offset
--   and message id, the segment holding it, and `groups`: one element per consumer group with a cursor
--   on the partition, ordered by group name: {"group" (the stored name, '__QUEUE_MODE__' for queue
--   mode), "name" (NULL for queue mode), "queueMode", "cursor", "state" ('dead': a dead letter of that
--   group exists for the offset; 'consumed': below the cursor, or an offset the group passes over;
--   'leased': inside a live lease; else 'pending'), "consumed" (below the cursor: an autoAck pop, a
--   completed ack, a dead letter; or an offset the group passes over, log_passes: an operator's dead
--   letter or delete above the cursor), "leaseExpiresAt" (ISO, the live lease that holds the message
--   unconsumed, else NULL), "deliveries" (times the group's current delivery range was handed out
--   when the message is in it, else NULL)}; `dead`: the dead letters of the offset
--   [{"consumerGroup","error","attempts","failedAt"}], newest last. Locks: none (reads).
--
-- queen.message_delete_v1(tenant, partition_id, txn_hash, now) -> jsonb
--   Called by: DELETE /api/v1/messages/{partitionId}/{transactionId}. A log cannot drop a message from
--   its middle (offsets are gapless and a segment holds many messages), so "delete" means: the message
--   (every message the transactionId names in the partition) is settled for every consumer group that
--   exists on the queue now and has not passed it (a log_passes row: acked_total counts it, a cursor
--   moves over it when it is next in line, a lease whose whole range is now done is released), its dead
--   letters are removed, and its transactionId hashes are dropped (it can no longer be acked, read or
--   retried by transactionId, and a new push with the same transactionId is not a duplicate). The bytes stay in their segment until retention deletes the segment: a group
--   created later from the first retained message, or a seek back, still reads it.
--   Result: {"status":"deleted","queue","partition","partitionId","offset" (the newest),"offsets",
--   "groupsSettled" (groups that had one of them pending),"leasesReleased","deadLettersRemoved"} or
--   {"status":"no_partition"|"no_message"}.
--   Locks (docs/architecture.md#lock-order): the log_partitions row FOR NO KEY UPDATE (#2: serializes with pushes that
--   may add a hash row of the same transactionId), then the partition's log_consumers rows FOR UPDATE ascending
--   (partition_id, consumer_group) (#3); the log_txns and log_dlq rows deleted.

CREATE OR REPLACE FUNCTION queen.messages_list_v3(
    p_tenant text, p_queue text, p_partition text, p_from_offset bigint, p_to_offset bigint,
    p_since timestamptz, p_until timestamptz, p_desc boolean, p_group text, p_limit integer, p_offset integer,
    p_status text, p_now timestamptz, p_max_bytes bigint)
RETURNS TABLE (status text, total bigint, partition_id bigint, partition_name text, base_offset bigint,
               created_at timestamptz, dropped integer[], codec smallint, payload bytea, lo bigint, hi bigint,
               skip bigint, states text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_qid     bigint;
    v_now     timestamptz := coalesce(p_now, now());
    v_missing text;
BEGIN
    SELECT q.id INTO v_qid FROM queen.queues q WHERE q.tenant = p_tenant AND q.name = p_queue;
    v_missing := CASE
        WHEN v_qid IS NULL THEN 'no_queue'
        WHEN p_partition IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM queen.log_partitions p WHERE p.queue_id = v_qid AND p.name = p_partition) THEN 'no_partition'
        WHEN p_group IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM queen.log_groups g WHERE g.queue_id = v_qid AND g.name = p_group) THEN 'no_group'
    END;
    IF v_missing IS NOT NULL THEN  -- the one refusal row: its status, nothing else
        RETURN QUERY SELECT v_missing, 0::bigint, NULL::bigint, NULL::text, NULL::bigint,
                            NULL::timestamptz, NULL::integer[], NULL::smallint, NULL::bytea, NULL::bigint,
                            NULL::bigint, NULL::bigint, NULL::text;
        RETURN;
    END IF;

    RETURN QUERY
    WITH segs AS (
        SELECT s.partition_id, p.name AS pname, s.base_offset, s.created_at,
               greatest(s.base_offset, coalesce(p_from_offset, s.base_offset)) AS lo,
               least(s.end_offset, coalesce(p_to_offset, s.end_offset)) AS hi
          FROM queen.log_partitions p
          JOIN queen.log_segments s ON s.partition_id = p.id
         WHERE p.queue_id = v_qid
           AND (p_partition IS NULL OR p.name = p_partition)
           AND (p_from_offset IS NULL OR s.end_offset > p_from_offset)
           AND (p_to_offset IS NULL OR s.base_offset < p_to_offset)
           AND (p_since IS NULL OR s.created_at >= p_since)
           AND (p_until IS NULL OR s.created_at < p_until)
    ), cut AS (
        -- with a status: [lo, c_end) is below the cursor, [c_end, l_end) under the live lease
        SELECT segs.*, lc.cursor_offset AS cur,
               CASE WHEN lc.cursor_offset IS NULL THEN segs.lo
                    ELSE greatest(segs.lo, least(segs.hi, lc.cursor_offset)) END AS c_end,
               CASE WHEN lc.lease_id IS NOT NULL AND lc.lease_expires_at > v_now THEN lc.lease_end END AS le
          FROM segs
          LEFT JOIN queen.log_consumers lc
            ON p_status IS NOT NULL AND lc.partition_id = segs.partition_id AND lc.consumer_group = p_group
         WHERE segs.hi > segs.lo
    ), ranged AS (
        SELECT cut.*,
               CASE WHEN cut.le IS NULL THEN cut.c_end ELSE greatest(cut.c_end, least(cut.hi, cut.le)) END AS l_end
          FROM cut
    ), counted AS (
        SELECT ranged.partition_id, ranged.pname, ranged.base_offset, ranged.created_at, ranged.lo, ranged.hi,
               CASE WHEN p_status IS NULL THEN ranged.hi - ranged.lo
                    ELSE CASE p_status WHEN 'consumed' THEN ranged.c_end - ranged.lo
                                       WHEN 'leased' THEN ranged.l_end - ranged.c_end
                                       WHEN 'pending' THEN ranged.hi - ranged.l_end
                                       ELSE 0 END
                         + (SELECT coalesce(sum((e.actual = p_status)::int - (e.by_range = p_status)::int), 0)
                              FROM (SELECT CASE WHEN bool_or(x.dead) THEN 'dead'
                                                WHEN ranged.cur IS NOT NULL THEN 'consumed'
                                                ELSE 'pending' END AS actual,
                                           CASE WHEN x.o < ranged.c_end THEN 'consumed'
                                                WHEN x.o < ranged.l_end THEN 'leased'
                                                ELSE 'pending' END AS by_range
                                      FROM (SELECT d.msg_offset AS o, true AS dead FROM queen.log_dlq d
                                             WHERE d.partition_id = ranged.partition_id
                                               AND d.consumer_group = p_group
                                               AND d.msg_offset >= ranged.lo AND d.msg_offset < ranged.hi
                                            UNION ALL
                                            SELECT lp.msg_offset, false FROM queen.log_passes lp
                                             WHERE lp.partition_id = ranged.partition_id
                                               AND lp.consumer_group = p_group
                                               AND lp.msg_offset >= ranged.lo AND lp.msg_offset < ranged.hi) x
                                     GROUP BY x.o) e)
               END AS n
          FROM ranged
    ), ordered AS (
        SELECT counted.*,
               CASE WHEN p_desc
                    THEN sum(counted.n) OVER (ORDER BY counted.created_at DESC, counted.partition_id DESC,
                                              counted.base_offset DESC ROWS UNBOUNDED PRECEDING)
                    ELSE sum(counted.n) OVER (ORDER BY counted.created_at, counted.partition_id,
                                              counted.base_offset ROWS UNBOUNDED PRECEDING)
               END - counted.n AS before
          FROM counted
         WHERE counted.n > 0
    ), total AS (
        SELECT coalesce(sum(ordered.n), 0)::bigint AS n FROM ordered
    ), page AS (
        SELECT ordered.* FROM ordered
         WHERE ordered.before < greatest(p_offset, 0)::bigint + greatest(p_limit, 0)
           AND ordered.before + ordered.n > greatest(p_offset, 0)
    ), paid AS (
        -- the stored bytes of the page's segments before each one (octet_length reads no payload)
        SELECT page.*,
               coalesce(sum(octet_length(ps.payload)) OVER (ORDER BY page.before
                                                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
                   AS bytes_before
          FROM page
          JOIN queen.log_segments ps ON ps.partition_id = page.partition_id AND ps.base_offset = page.base_offset
    ), kept AS (
        SELECT paid.* FROM paid WHERE p_max_bytes IS NULL OR paid.bytes_before < p_max_bytes
    )
    SELECT 'ok'::text, total.n, page.partition_id, page.pname, page.base_offset, page.created_at,
           s.dropped, s.codec, s.payload, page.lo, page.hi, page.before::bigint,
           -- the state of each offset of [lo, hi) for the group, one letter each: d(ead), c(onsumed),
           -- l(eased), p(ending); the rule of the header, with the exceptions read once per segment
           CASE WHEN p_group IS NOT NULL THEN
               (SELECT string_agg(CASE WHEN o = ANY (x.dead) THEN 'd'
                                       WHEN lc.cursor_offset IS NOT NULL
                                            AND (o < lc.cursor_offset OR o = ANY (x.passes)) THEN 'c'
                                       WHEN lc.lease_id IS NOT NULL AND lc.lease_expires_at > v_now
                                            AND o < lc.lease_end THEN 'l'
                                       ELSE 'p' END, '' ORDER BY o)
                  FROM generate_series(page.lo, page.hi - 1) AS o)
           END
      FROM total
      LEFT JOIN kept AS page ON true
      LEFT JOIN queen.log_segments s ON s.partition_id = page.partition_id AND s.base_offset = page.base_offset
      LEFT JOIN queen.log_consumers lc ON lc.partition_id = page.partition_id AND lc.consumer_group = p_group
      LEFT JOIN LATERAL (
            SELECT ARRAY(SELECT lp.msg_offset FROM queen.log_passes lp
                          WHERE lp.partition_id = page.partition_id AND lp.consumer_group = p_group
                            AND lp.msg_offset >= page.lo AND lp.msg_offset < page.hi) AS passes,
                   ARRAY(SELECT d.msg_offset FROM queen.log_dlq d
                          WHERE d.partition_id = page.partition_id AND d.consumer_group = p_group
                            AND d.msg_offset >= page.lo AND d.msg_offset < page.hi) AS dead
             WHERE p_group IS NOT NULL) x ON true
     ORDER BY page.before;
END;
$$;

CREATE OR REPLACE FUNCTION queen.message_get_v2(
    p_tenant text, p_partition_id bigint, p_txn_hash uuid, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (status text, queue_name text, namespace text, task text, queue_config jsonb, partition_name text,
               msg_offset bigint, message_id uuid, offsets bigint[], base_offset bigint, created_at timestamptz,
               dropped integer[], codec smallint, payload bytea, groups jsonb, dead jsonb)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    p     record;
    t     record;
BEGIN
    SELECT lp.id, lp.name, q.name AS qname, q.namespace AS qns, q.task AS qtask,
           jsonb_build_object(
               'leaseTime', q.lease_time, 'retryLimit', q.retry_limit, 'priority', q.priority,
               'delayedProcessing', q.delayed_processing, 'windowBuffer', q.window_buffer,
               'maxSize', q.max_size, 'retentionSeconds', q.retention_seconds,
               'completedRetentionSeconds', q.completed_retention_seconds,
               'dedupWindowSeconds', q.dedup_window_seconds, 'encryptionEnabled', q.encryption_enabled) AS config
      INTO p
      FROM queen.log_partitions lp JOIN queen.queues q ON q.id = lp.queue_id
     WHERE lp.id = p_partition_id AND lp.tenant = p_tenant;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'no_partition'::text, NULL::text, NULL::text, NULL::text, NULL::jsonb, NULL::text,
                            NULL::bigint, NULL::uuid, NULL::bigint[], NULL::bigint, NULL::timestamptz,
                            NULL::integer[], NULL::smallint, NULL::bytea, NULL::jsonb, NULL::jsonb;
        RETURN;
    END IF;
    SELECT lt.msg_offset, lt.message_id INTO t
      FROM queen.log_txns lt WHERE lt.partition_id = p_partition_id AND lt.txn_hash = p_txn_hash
     ORDER BY lt.msg_offset DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'no_message'::text, p.qname, p.qns, p.qtask, p.config, p.name,
                            NULL::bigint, NULL::uuid, NULL::bigint[], NULL::bigint, NULL::timestamptz,
                            NULL::integer[], NULL::smallint, NULL::bytea, NULL::jsonb, NULL::jsonb;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT 'ok'::text, p.qname, p.qns, p.qtask, p.config, p.name, t.msg_offset, t.message_id,
           ARRAY(SELECT lt.msg_offset FROM queen.log_txns lt
                  WHERE lt.partition_id = p_partition_id AND lt.txn_hash = p_txn_hash ORDER BY 1),
           s.base_offset, s.created_at, s.dropped, s.codec, s.payload,
           coalesce((
               SELECT jsonb_agg(jsonb_build_object(
                          'group', g.consumer_group,
                          'name', queen._group_out(g.consumer_group),
                          'queueMode', queen._queue_mode(g.consumer_group),
                          'cursor', g.cursor_offset,
                          'state', CASE WHEN g.dead THEN 'dead' WHEN g.consumed THEN 'consumed'
                                        WHEN g.leased THEN 'leased' ELSE 'pending' END,
                          'consumed', g.consumed,
                          'leaseExpiresAt', CASE WHEN g.leased THEN queen._iso_utc(g.lease_expires_at) END,
                          'deliveries', CASE WHEN NOT g.consumed AND t.msg_offset < g.delivered_end
                                             THEN g.attempts END) ORDER BY g.consumer_group)
                 FROM (SELECT lc.consumer_group, lc.cursor_offset, lc.lease_expires_at, lc.delivered_end,
                              lc.attempts, c.consumed,
                              NOT c.consumed AND lc.lease_id IS NOT NULL AND lc.lease_expires_at > v_now
                                  AND t.msg_offset < lc.lease_end AS leased,
                              EXISTS (SELECT 1 FROM queen.log_dlq d
                                       WHERE d.partition_id = p_partition_id AND d.msg_offset = t.msg_offset
                                         AND d.consumer_group = lc.consumer_group) AS dead
                         FROM queen.log_consumers lc
                        CROSS JOIN LATERAL (
                              SELECT (t.msg_offset < lc.cursor_offset
                                      OR EXISTS (SELECT 1 FROM queen.log_passes ps
                                                  WHERE ps.partition_id = p_partition_id
                                                    AND ps.consumer_group = lc.consumer_group
                                                    AND ps.msg_offset = t.msg_offset)) AS consumed) c
                        WHERE lc.partition_id = p_partition_id) g), '[]'::jsonb),
           coalesce((
               SELECT jsonb_agg(jsonb_build_object(
                          'consumerGroup', queen._group_out(d.consumer_group), 'error', d.error,
                          'attempts', d.attempts, 'failedAt', queen._iso_utc(d.failed_at)) ORDER BY d.id)
                 FROM queen.log_dlq d WHERE d.partition_id = p_partition_id AND d.msg_offset = t.msg_offset),
               '[]'::jsonb)
      FROM (SELECT 1) AS one
      LEFT JOIN LATERAL (
            SELECT s.base_offset, s.created_at, s.dropped, s.codec, s.payload FROM queen.log_segments s
             WHERE s.partition_id = p_partition_id AND s.base_offset <= t.msg_offset
             ORDER BY s.base_offset DESC LIMIT 1) s ON true;
END;
$$;

CREATE OR REPLACE FUNCTION queen.message_delete_v1(
    p_tenant text, p_partition_id bigint, p_txn_hash uuid, p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now      timestamptz := coalesce(p_now, clock_timestamp());
    p          record;
    v_offs     bigint[];
    v_off      bigint;
    c          record;
    v_cursor   bigint;
    v_hits     integer;
    v_one      integer;
    v_settled  integer := 0;
    v_released integer := 0;
    v_dead     integer;
BEGIN
    SELECT lp.id, lp.name, q.name AS qname INTO p
      FROM queen.log_partitions lp JOIN queen.queues q ON q.id = lp.queue_id
     WHERE lp.id = p_partition_id AND lp.tenant = p_tenant
       FOR NO KEY UPDATE OF lp;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('status', 'no_partition');
    END IF;
    v_offs := ARRAY(SELECT lt.msg_offset FROM queen.log_txns lt
                     WHERE lt.partition_id = p_partition_id AND lt.txn_hash = p_txn_hash ORDER BY 1);
    IF cardinality(v_offs) = 0 THEN
        RETURN jsonb_build_object('status', 'no_message');
    END IF;

    FOR c IN
        SELECT lc.* FROM queen.log_consumers lc
         WHERE lc.partition_id = p_partition_id
         ORDER BY lc.partition_id, lc.consumer_group
           FOR UPDATE
    LOOP
        v_hits := 0;
        FOREACH v_off IN ARRAY v_offs LOOP
            CONTINUE WHEN v_off < c.cursor_offset;
            INSERT INTO queen.log_passes (partition_id, consumer_group, msg_offset)
            VALUES (c.partition_id, c.consumer_group, v_off) ON CONFLICT DO NOTHING;
            GET DIAGNOSTICS v_one = ROW_COUNT;
            v_hits := v_hits + v_one;
        END LOOP;
        CONTINUE WHEN v_hits = 0;
        v_cursor := queen._pass_over(c.partition_id, c.consumer_group, c.cursor_offset);
        v_settled := v_settled + 1;
        IF c.lease_id IS NOT NULL AND c.lease_expires_at > v_now AND v_cursor >= c.lease_end THEN
            v_released := v_released + 1;
            UPDATE queen.log_consumers lc
               SET released_lease_id = lc.lease_id, lease_id = NULL, lease_expires_at = NULL, lease_end = NULL
             WHERE lc.partition_id = c.partition_id AND lc.consumer_group = c.consumer_group;
        END IF;
        UPDATE queen.log_consumers lc
           SET cursor_offset = v_cursor,
               attempts = CASE WHEN v_cursor >= lc.delivered_end THEN 0 ELSE lc.attempts END,
               fail_offset = CASE WHEN lc.fail_offset < v_cursor OR lc.fail_offset = ANY (v_offs) THEN NULL
                                  ELSE lc.fail_offset END,
               failures = CASE WHEN lc.fail_offset < v_cursor OR lc.fail_offset = ANY (v_offs) THEN 0
                               ELSE lc.failures END,
               acked_total = lc.acked_total + v_hits
         WHERE lc.partition_id = c.partition_id AND lc.consumer_group = c.consumer_group;
    END LOOP;

    DELETE FROM queen.log_dlq d WHERE d.partition_id = p_partition_id AND d.msg_offset = ANY (v_offs);
    GET DIAGNOSTICS v_dead = ROW_COUNT;
    DELETE FROM queen.log_txns lt WHERE lt.partition_id = p_partition_id AND lt.txn_hash = p_txn_hash;

    RETURN jsonb_build_object(
        'status', 'deleted', 'queue', p.qname, 'partition', p.name, 'partitionId', p.id::text,
        'offset', v_offs[cardinality(v_offs)], 'offsets', to_jsonb(v_offs), 'groupsSettled', v_settled, 'leasesReleased', v_released,
        'deadLettersRemoved', v_dead);
END;
$$;
