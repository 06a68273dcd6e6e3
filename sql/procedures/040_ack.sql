-- queen.ack_v1: settle delivered messages for their consumer groups.
--
-- Called by: POST /api/v1/ack and POST /api/v1/ack/batch (queen_pg/engine/ack.py).
-- Inputs:  parallel arrays, one entry per ack item: partition id, xxh3-128 hash of the transactionId,
--          transactionId text (for the DLQ row), lease id (NULL = no lease check), consumer group,
--          status ('completed' | 'failed' | 'retry' | 'dlq'; the broker maps 'success' to
--          'completed'), error text.
-- Result:  one row per item, in input order: (idx, success, error, lease_released, dlq, noop).
--          A refused item is success=false with a readable error; the call itself never raises for
--          a refused item.
-- Locks:   (docs/locks.md #3) log_consumers rows FOR UPDATE, ascending (partition_id, group).
-- Rules:   With a lease id, the lease must be the row's live lease (same id, not expired) and the
--          message inside the leased range; an ack resent after its lease was released by the acks
--          that completed it is answered as the first one was (noop). Without a lease id the check
--          is skipped. 'completed' marks the offset done and moves the cursor over every contiguous
--          done offset; when the leased range is done the lease is released. 'failed' ends the lease
--          (the rest of the batch is redelivered) and charges the queue's retryLimit once per call,
--          against the lowest failed message (fail_offset/failures on the cursor row); when that
--          message has failed more than retryLimit times it goes to log_dlq and counts as done, in
--          the same transaction. 'retry' ends the lease without charging; 'dlq' dead-letters at once.
--          Lease release applies after every item of the call for that cursor row; leaseReleased is
--          reported on the row's last item. The DLQ row's payload is filled by the dlq_fill job.

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
LANGUAGE plpgsql AS $$
DECLARE
    v_now       timestamptz := coalesce(p_now, clock_timestamp());
    v_n_items   integer := cardinality(p_partition_ids);
    r_success   boolean[] := array_fill(false, ARRAY[v_n_items]);
    r_error     text[] := array_fill(NULL::text, ARRAY[v_n_items]);
    r_released  boolean[] := array_fill(false, ARRAY[v_n_items]);
    r_dlq       boolean[] := array_fill(false, ARRAY[v_n_items]);
    r_noop      boolean[] := array_fill(false, ARRAY[v_n_items]);
    k           record;
    it          record;
    c           queen.log_consumers%ROWTYPE;
    v_limit     integer;
    v_live      boolean;
    v_off       bigint;
    v_msgid     uuid;
    v_created   timestamptz;
    v_end_lease boolean;
    v_n         integer;
    v_last      integer;
    -- the lowest offset failed in this call for the current cursor row, and its item
    f_off       bigint;
    f_ord       integer;
    f_txn       text;
    f_msgid     uuid;
    f_created   timestamptz;
    f_err       text;
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
            FOR it IN SELECT o AS ord FROM unnest(k.ords) AS o
            LOOP
                r_error[it.ord] := CASE WHEN k.grp = '__QUEUE_MODE__'
                    THEN format('partition %s has no queue-mode cursor (never popped, or deleted)', k.pid)
                    ELSE format('consumer group %s has no cursor on partition %s', k.grp, k.pid) END;
            END LOOP;
            CONTINUE;
        END IF;
        SELECT q.retry_limit INTO v_limit FROM queen.queues q WHERE q.id = c.queue_id;
        v_live := c.lease_id IS NOT NULL AND c.lease_expires_at > v_now;
        v_end_lease := false;
        v_n := 0;
        f_off := NULL;

        FOR it IN
            SELECT o AS ord, p_hashes[o] AS hash, p_txn_ids[o] AS txn, p_lease_ids[o] AS lease,
                   p_statuses[o] AS status, p_errors[o] AS err
              FROM unnest(k.ords) AS o
        LOOP
            v_last := it.ord;
            -- the oldest message of that transactionId this group has not settled; else the newest
            SELECT t.msg_offset, t.message_id, t.created_at INTO v_off, v_msgid, v_created
              FROM queen.log_txns t
             WHERE t.partition_id = k.pid AND t.txn_hash = it.hash
             ORDER BY (t.msg_offset < c.cursor_offset OR t.msg_offset = ANY (c.acked)),
                      CASE WHEN t.msg_offset < c.cursor_offset OR t.msg_offset = ANY (c.acked)
                           THEN -t.msg_offset ELSE t.msg_offset END
             LIMIT 1;
            IF NOT FOUND THEN
                r_error[it.ord] := format('message %s not found in partition %s', it.txn, k.pid);
                CONTINUE;
            END IF;

            IF it.lease IS NOT NULL THEN
                IF v_live AND c.lease_id = it.lease THEN
                    IF v_off >= c.lease_end AND v_off >= c.cursor_offset AND NOT v_off = ANY (c.acked) THEN
                        r_error[it.ord] := 'message is not part of this lease';
                        CONTINUE;
                    END IF;
                ELSIF c.released_lease_id = it.lease
                      AND (v_off < c.cursor_offset OR v_off = ANY (c.acked)) THEN
                    r_success[it.ord] := true;   -- resent after it applied: answered alike
                    r_noop[it.ord] := true;
                    CONTINUE;
                ELSE
                    r_error[it.ord] := CASE WHEN c.lease_id = it.lease THEN 'lease expired'
                        ELSE 'lease is not held (expired or taken by another consumer)' END;
                    CONTINUE;
                END IF;
            END IF;

            IF v_off < c.cursor_offset OR v_off = ANY (c.acked) THEN
                r_success[it.ord] := true;
                r_noop[it.ord] := true;
                CONTINUE;
            END IF;

            r_success[it.ord] := true;
            IF it.status = 'failed' THEN
                v_end_lease := true;
                IF f_off IS NULL OR v_off < f_off THEN
                    f_off := v_off; f_ord := it.ord; f_txn := it.txn; f_msgid := v_msgid;
                    f_created := v_created; f_err := it.err;
                END IF;
                CONTINUE;
            ELSIF it.status = 'retry' THEN
                v_end_lease := true;
                CONTINUE;
            ELSIF it.status = 'dlq' THEN
                INSERT INTO queen.log_dlq (tenant, queue_id, partition_id, consumer_group, msg_offset,
                                           message_id, transaction_id, error, attempts, created_at, failed_at)
                VALUES (p_tenant, c.queue_id, k.pid, k.grp, v_off, v_msgid, it.txn, it.err,
                        greatest(c.attempts, 1), v_created, v_now);
                r_dlq[it.ord] := true;
            END IF;
            -- completed, or dead-lettered: done for this group
            c.acked := array_append(c.acked, v_off);
            v_n := v_n + 1;
            WHILE c.cursor_offset = ANY (c.acked) LOOP
                c.acked := array_remove(c.acked, c.cursor_offset);
                c.cursor_offset := c.cursor_offset + 1;
            END LOOP;
        END LOOP;

        -- The retry budget is charged once per call, against the lowest failed message: it is the
        -- one the redelivery starts from (everything after it comes back anyway).
        IF f_off IS NOT NULL AND NOT (f_off < c.cursor_offset OR f_off = ANY (c.acked)) THEN
            IF c.fail_offset = f_off THEN
                c.failures := c.failures + 1;
            ELSE
                c.fail_offset := f_off;
                c.failures := 1;
            END IF;
            IF c.failures > v_limit THEN
                INSERT INTO queen.log_dlq (tenant, queue_id, partition_id, consumer_group, msg_offset,
                                           message_id, transaction_id, error, attempts, created_at, failed_at)
                VALUES (p_tenant, c.queue_id, k.pid, k.grp, f_off, f_msgid, f_txn, f_err,
                        c.failures, f_created, v_now);
                r_dlq[f_ord] := true;
                c.fail_offset := NULL;
                c.failures := 0;
                c.acked := array_append(c.acked, f_off);
                v_n := v_n + 1;
                WHILE c.cursor_offset = ANY (c.acked) LOOP
                    c.acked := array_remove(c.acked, c.cursor_offset);
                    c.cursor_offset := c.cursor_offset + 1;
                END LOOP;
            END IF;
        END IF;
        IF c.fail_offset IS NOT NULL AND c.fail_offset < c.cursor_offset THEN
            c.fail_offset := NULL;
            c.failures := 0;
        END IF;

        IF c.lease_id IS NOT NULL AND v_live
           AND (v_end_lease OR c.cursor_offset >= c.lease_end) THEN
            c.released_lease_id := c.lease_id;
            c.lease_id := NULL;
            c.lease_expires_at := NULL;
            c.lease_end := NULL;
            r_released[v_last] := true;
        END IF;
        IF c.cursor_offset >= c.delivered_end THEN
            c.attempts := 0;
        END IF;
        UPDATE queen.log_consumers lc
           SET cursor_offset = c.cursor_offset,
               acked = ARRAY(SELECT a FROM unnest(c.acked) AS a ORDER BY a),
               lease_id = c.lease_id, lease_expires_at = c.lease_expires_at, lease_end = c.lease_end,
               released_lease_id = c.released_lease_id,
               attempts = c.attempts, fail_offset = c.fail_offset, failures = c.failures,
               acked_total = lc.acked_total + v_n
         WHERE lc.partition_id = k.pid AND lc.consumer_group = k.grp;
    END LOOP;

    RETURN QUERY
    SELECT g.i, r_success[g.i], r_error[g.i], r_released[g.i], r_dlq[g.i], r_noop[g.i]
      FROM generate_series(1, v_n_items) AS g(i)
     ORDER BY g.i;
END;
$$;

-- queen.lease_extend_v1: renew every live lease under a lease id by its queue's leaseTime.
-- Called by: POST /api/v1/lease/{leaseId}/extend. Result: (renewed count, new expiry or NULL).
-- Locks: log_consumers rows FOR UPDATE (docs/locks.md #3), through the UPDATE.
CREATE OR REPLACE FUNCTION queen.lease_extend_v1(p_tenant text, p_lease_id uuid, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (renewed integer, expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    RETURN QUERY
    WITH upd AS (
        UPDATE queen.log_consumers lc
           SET lease_expires_at = v_now + make_interval(secs => greatest(q.lease_time, 1))
          FROM queen.queues q
         WHERE lc.lease_id = p_lease_id AND lc.lease_expires_at > v_now AND lc.tenant = p_tenant
           AND q.id = lc.queue_id
        RETURNING lc.lease_expires_at
    )
    SELECT count(*)::integer, max(upd.lease_expires_at) FROM upd;
END;
$$;
