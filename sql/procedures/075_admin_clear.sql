-- Two 0.x admin calls (docs/wire.md#legacy-admin): dead-letter one message now, and clear a queue.
--
-- queen.message_dlq_v1(tenant, partition_id, txn_hash, txn, group, error, now) -> jsonb
--   Called by: POST /api/v1/messages/{partitionId}/{transactionId}/dlq[?consumerGroup=g]
--   (queen_pg/engine/admin_moves.py). Dead-letters the message for ONE consumer group: the one named,
--   else queue mode ('__QUEUE_MODE__'). A dead letter belongs to a group in this log (each group has
--   its own cursor and retry budget), so other groups are not touched: they still read the message.
--   "Consumed" for the group (docs/wire.md#ack-offset-commit, an ack is an offset commit) = below its cursor, or an offset
--   it passes over (a queen.log_passes row). The message is the one the group has not consumed among
--   those the transactionId names (the oldest), else the newest.
--   Effect, as an ack with status `dlq` would write it: a log_dlq row (transaction_id = p_txn, the text
--   whose hash is p_txn_hash; error = p_error; attempts = the deliveries of the group's current range
--   when the message is in it, else 0; payload NULL, filled by the dlq_fill job); then the group passes
--   over the message: at the cursor, the cursor moves past it and past the log_passes offsets that
--   follow (queen._pass_over); above the cursor, a log_passes row (the messages before it stay
--   pending, nothing is committed through it; pop and ack pass over it when the cursor gets there).
--   acked_total + 1; the retry budget cleared when it was spent on this message. A lease whose whole
--   range is now behind the cursor (only settled messages) is released (released_lease_id: the cursor
--   row is written by the ack's own commit rule, queen._ack_commit in 040_ack.sql); a live lease that still holds pending messages stays: its holder's later ack of this
--   message is an ordinary one (a completed ack commits the cursor through it; a nack of it clamps the
--   cursor at it and the next claim passes over it).
--   Result: {"status": "moved", "queue", "partition", "partitionId", "consumerGroup" (NULL for queue
--   mode), "queueMode", "offset", "messageId", "leaseReleased"}; or {"status": "no_partition" |
--   "no_group" (the group has no cursor on the partition) | "no_message" | "already_dead" (the group
--   dead-lettered it before: nothing written) | "already_consumed" (the group consumed it: nothing
--   written), "offset"?}.
--   Locks (docs/architecture.md#lock-order): the group's log_consumers row FOR UPDATE (#3); under it the log_dlq insert
--   (no foreign keys: no lock on the partition or queue row, as in ack_v1) and the log_passes insert
--   (KEY SHARE on that same cursor row, already held). The partition row is read, not locked.
--
-- queen.queue_clear_v1(tenant, queue, partition, now) -> jsonb
--   Called by: DELETE /api/v1/queues/{queue}/clear[?partition=p]. Drops every message of the queue (or
--   of one partition): its segments, its transactionId hashes and its dead letters. The queue, its
--   configuration, its partitions and its consumer groups stay. Offsets are never reused: each
--   partition keeps next_offset, and every cursor of every group moves to it (delivered_end =
--   next_offset, attempts and retry budget cleared, acked_total kept) and the log_passes rows of those
--   cursors are deleted (all below the new cursor), so each group has nothing pending and reads what
--   is pushed from now on. Leases are broken: lease and released lease cleared;
--   a holder's later ack of a dropped message finds no transactionId (success false) and changes
--   nothing. Pending timers of the queue are not messages yet and stay; traces stay until their
--   retention.
--   Result: {"status": "cleared", "queue", "partition" (NULL = all), "partitions" (cleared),
--   "messagesDropped" (retained messages), "deadLettersDropped", "leasesBroken" (live leases)} or
--   {"status": "no_queue" | "no_partition"}.
--   Locks (docs/architecture.md#lock-order): the queue row FOR UPDATE (#1: no partition or group is created meanwhile),
--   the partitions FOR NO KEY UPDATE ascending id (#2: the push write lock), their log_consumers rows
--   FOR UPDATE ascending (partition_id, group) (#3); then segments, hashes, dead letters and the
--   cursors' log_passes rows deleted.
--   Cost: one delete per table over the queue's rows; the call holds the queue's push lock meanwhile.
--
-- Errors: none of their own; refusals are results, which the broker maps to 404/409.

CREATE OR REPLACE FUNCTION queen.message_dlq_v1(
    p_tenant text, p_partition_id bigint, p_txn_hash uuid, p_txn text, p_group text, p_error text,
    p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now      timestamptz;
    p          record;
    c          record;
    t          record;
    v_cursor   bigint;
    v_released boolean := false;
BEGIN
    SELECT lp.id, lp.name, q.name AS qname INTO p
      FROM queen.log_partitions lp JOIN queen.queues q ON q.id = lp.queue_id
     WHERE lp.id = p_partition_id AND lp.tenant = p_tenant;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('status', 'no_partition');
    END IF;
    SELECT lc.* INTO c FROM queen.log_consumers lc
     WHERE lc.partition_id = p_partition_id AND lc.consumer_group = p_group
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('status', 'no_group');
    END IF;
    v_now := coalesce(p_now, clock_timestamp());  -- after the last lock wait

    SELECT lt.msg_offset, lt.message_id, lt.created_at, x.consumed INTO t
      FROM queen.log_txns lt
     CROSS JOIN LATERAL (
           SELECT lt.msg_offset < c.cursor_offset
                  OR EXISTS (SELECT 1 FROM queen.log_passes ps
                              WHERE ps.partition_id = p_partition_id AND ps.consumer_group = p_group
                                AND ps.msg_offset = lt.msg_offset) AS consumed) x
     WHERE lt.partition_id = p_partition_id AND lt.txn_hash = p_txn_hash
     ORDER BY x.consumed, CASE WHEN x.consumed THEN -lt.msg_offset ELSE lt.msg_offset END
     LIMIT 1;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('status', 'no_message');
    END IF;
    IF t.consumed THEN
        RETURN jsonb_build_object(
            'status', CASE WHEN EXISTS (SELECT 1 FROM queen.log_dlq d
                                         WHERE d.partition_id = p_partition_id AND d.msg_offset = t.msg_offset
                                           AND d.consumer_group = p_group)
                           THEN 'already_dead' ELSE 'already_consumed' END,
            'offset', t.msg_offset);
    END IF;

    INSERT INTO queen.log_dlq (tenant, queue_id, partition_id, consumer_group, msg_offset, message_id,
                               transaction_id, error, attempts, created_at, failed_at)
    VALUES (p_tenant, c.queue_id, p_partition_id, p_group, t.msg_offset, t.message_id, p_txn, p_error,
            CASE WHEN t.msg_offset < c.delivered_end THEN c.attempts ELSE 0 END, t.created_at, v_now);

    IF t.msg_offset = c.cursor_offset THEN
        v_cursor := queen._pass_over(p_partition_id, p_group, t.msg_offset + 1);
    ELSE  -- above the cursor: passed over when the cursor gets there
        INSERT INTO queen.log_passes (partition_id, consumer_group, msg_offset)
        VALUES (p_partition_id, p_group, t.msg_offset);
        v_cursor := c.cursor_offset;
    END IF;
    -- the ack's commit rule (queen._ack_commit, 040_ack.sql): one message settled (counted as acked),
    -- a live lease released once the cursor reaches its end; the retry budget spent on this message is
    -- dropped with it (as its fail offset and count, passed as the ones to keep)
    SELECT r.released INTO v_released
      FROM queen._ack_commit(p_partition_id, p_group, v_cursor, 1,
                             c.lease_id IS NOT NULL AND c.lease_expires_at > v_now, false,
                             CASE WHEN c.fail_offset = t.msg_offset THEN NULL ELSE c.fail_offset END,
                             CASE WHEN c.fail_offset = t.msg_offset THEN 0 ELSE c.failures END) AS r;

    RETURN jsonb_build_object(
        'status', 'moved', 'queue', p.qname, 'partition', p.name, 'partitionId', p.id::text,
        'consumerGroup', queen._group_out(p_group), 'queueMode', queen._queue_mode(p_group),
        'offset', t.msg_offset, 'messageId', t.message_id, 'leaseReleased', v_released);
END;
$$;

CREATE OR REPLACE FUNCTION queen.queue_clear_v1(
    p_tenant text, p_queue text, p_partition text, p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now      timestamptz;
    v_qid      bigint;
    v_pids     bigint[];
    v_messages bigint;
    v_dead     bigint;
    v_broken   bigint;
BEGIN
    SELECT q.id INTO v_qid FROM queen.queues q WHERE q.tenant = p_tenant AND q.name = p_queue FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('status', 'no_queue');
    END IF;
    SELECT array_agg(l.id ORDER BY l.id) INTO v_pids
      FROM (SELECT lp.id FROM queen.log_partitions lp
             WHERE lp.queue_id = v_qid AND (p_partition IS NULL OR lp.name = p_partition)
             ORDER BY lp.id
               FOR NO KEY UPDATE) AS l;
    IF v_pids IS NULL AND p_partition IS NOT NULL THEN
        RETURN jsonb_build_object('status', 'no_partition');
    END IF;
    v_pids := coalesce(v_pids, '{}');
    PERFORM 1 FROM queen.log_consumers lc
     WHERE lc.partition_id = ANY (v_pids)
     ORDER BY lc.partition_id, lc.consumer_group
       FOR UPDATE;
    v_now := coalesce(p_now, clock_timestamp());  -- after the last lock wait

    SELECT coalesce(sum(s.end_offset - s.base_offset), 0) INTO v_messages
      FROM queen.log_segments s WHERE s.partition_id = ANY (v_pids);
    SELECT count(*) FILTER (WHERE lc.lease_id IS NOT NULL AND lc.lease_expires_at > v_now) INTO v_broken
      FROM queen.log_consumers lc WHERE lc.partition_id = ANY (v_pids);

    DELETE FROM queen.log_segments s WHERE s.partition_id = ANY (v_pids);
    DELETE FROM queen.log_txns t WHERE t.partition_id = ANY (v_pids);
    DELETE FROM queen.log_dlq d WHERE d.partition_id = ANY (v_pids);
    GET DIAGNOSTICS v_dead = ROW_COUNT;
    DELETE FROM queen.log_passes ps WHERE ps.partition_id = ANY (v_pids);
    UPDATE queen.log_consumers lc
       SET cursor_offset = p.next_offset,
           lease_id = NULL, lease_expires_at = NULL, lease_end = NULL, released_lease_id = NULL,
           delivered_end = p.next_offset, attempts = 0, fail_offset = NULL, failures = 0
      FROM queen.log_partitions p
     WHERE p.id = lc.partition_id AND lc.partition_id = ANY (v_pids);

    RETURN jsonb_build_object(
        'status', 'cleared', 'queue', p_queue, 'partition', p_partition, 'partitions', cardinality(v_pids),
        'messagesDropped', v_messages, 'deadLettersDropped', v_dead, 'leasesBroken', v_broken);
END;
$$;
