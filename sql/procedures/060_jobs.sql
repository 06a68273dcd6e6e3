-- Background jobs: lease expiry, retention, DLQ payload fill (queen_pg/jobs/).
--
-- Leadership per tick: each job procedure first tries its own transaction-scoped advisory key
-- (docs/architecture.md#advisory-keys); a replica that does not get it returns "nothing done" at once,
-- so one replica does a job's work per tick and the others never wait. A try-lock never waits,
-- so the keys stand outside the row-lock order; the row locks below follow it.
--
-- Each call is bounded by p_limit; the job repeats the call at once while a batch comes back full.

-- queen.lease_expiry_v1: clear expired leases so views are honest and parked pops can be woken.
--
-- Called by: the lease_expiry job (queen_pg/jobs/lease_expiry.py).
-- Inputs:  p_limit (most cursor rows cleared), p_now (NULL = clock_timestamp()).
-- Result:  one row per (tenant, queue) that got leases back: (tenant, queue, leases cleared).
--          No rows = nothing expired, or another replica holds LEASE_EXPIRY_LOCK.
-- Locks:   (docs/architecture.md#lock-order) LEASE_EXPIRY_LOCK (try); log_consumers rows FOR UPDATE SKIP LOCKED,
--          ascending (partition_id, consumer_group) (#3): a row a pop or an ack holds is left for
--          the next tick.
-- Guarantees: only rows whose lease is still expired when locked are cleared: lease_id,
--          lease_expires_at and lease_end become NULL. released_lease_id is kept: it answers resent
--          acks of the lease that completed its range, and an expired lease must never become it.
--          Pops treat an expired lease as claimable with or without this job; delivery attempts
--          (delivered_end, attempts) are untouched, so the next claim still counts the redelivery.
-- Leases by id: the leased rows are found through queen.log_leases (log_consumers has no index on
--          lease_id, schema.sql). Then the call deletes up to 200 × p_limit stale log_leases rows (the
--          default job: 200,000 per 5 s tick, i.e. 40,000 leased pops a second), those whose cursor row
--          does not hold that lease (acked, released, expired and cleared, claimed again, or gone).
--          With the job off on every replica the table grows by one row per leased pop. A row is judged in one snapshot with its cursor row (a pop writes both in
--          one transaction, and a lease id is never claimed again once its cursor row let it go), so a
--          live lease's row is never deleted. Deleting takes no lock but those rows' own.

CREATE OR REPLACE FUNCTION queen.lease_expiry_v1(p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (tenant text, queue text, leases integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    IF NOT pg_try_advisory_xact_lock(7781200101) THEN  -- LEASE_EXPIRY_LOCK
        RETURN;
    END IF;
    RETURN QUERY
    WITH expired AS (
        SELECT lc.partition_id, lc.consumer_group
          FROM queen.log_leases l
          JOIN queen.log_consumers lc
            ON lc.partition_id = l.partition_id AND lc.consumer_group = l.consumer_group
         WHERE lc.lease_id = l.lease_id AND lc.lease_expires_at <= v_now
         ORDER BY lc.partition_id, lc.consumer_group
         LIMIT greatest(p_limit, 1)
           FOR UPDATE OF lc SKIP LOCKED
    ), cleared AS (
        UPDATE queen.log_consumers lc
           SET lease_id = NULL, lease_expires_at = NULL, lease_end = NULL
          FROM expired e
         WHERE lc.partition_id = e.partition_id AND lc.consumer_group = e.consumer_group
           AND lc.lease_id IS NOT NULL AND lc.lease_expires_at <= v_now
        RETURNING lc.tenant, lc.queue_id
    )
    SELECT c.tenant, q.name, count(*)::integer
      FROM cleared c
      JOIN queen.queues q ON q.id = c.queue_id
     GROUP BY c.tenant, q.name
     ORDER BY 1, 2;
    -- stale lease rows (this call's cleared ones included: a new statement sees them)
    DELETE FROM queen.log_leases l
     WHERE l.ctid = ANY (ARRAY(
            SELECT s.ctid FROM queen.log_leases s
             WHERE NOT EXISTS (SELECT 1 FROM queen.log_consumers lc
                                WHERE lc.partition_id = s.partition_id AND lc.consumer_group = s.consumer_group
                                  AND lc.lease_id = s.lease_id)
             LIMIT greatest(p_limit, 1) * 200));
END;
$$;

-- queen._evictable_segments: the oldest segments retention may delete (internal to retention_v1).
--
-- Inputs:  p_now, p_limit, p_partitions (NULL = every partition). Result: (partition_id,
--          base_offset, end_offset, queue_id), oldest first. Reads only; takes no locks.
-- Rule:    a segment is evictable when it is past a retention window of its queue —
--          retention_seconds > 0 and created_at < now - retention_seconds, or
--          completed_retention_seconds > 0 and created_at < now - completed_retention_seconds and the
--          partition has at least one cursor (with no consumer group nothing was completed) — and,
--          in both cases, every cursor of the partition (any group) is at or past end_offset, and no
--          dead letter of the partition inside [base_offset, end_offset) still waits for its payload
--          (log_dlq.payload IS NULL: dlq_fill reads it from this segment). Both windows 0 = kept
--          forever. Cursors and dead letters are read in one snapshot: an ack moves a cursor and
--          writes its dead letter in one transaction, so the two are never seen apart.

CREATE OR REPLACE FUNCTION queen._evictable_segments(
    p_now timestamptz, p_limit integer, p_partitions bigint[])
RETURNS TABLE (partition_id bigint, base_offset bigint, end_offset bigint, queue_id bigint)
LANGUAGE sql STABLE AS $$
    -- Per partition of a queue with a window: the lowest cursor bounds a primary-key range scan of
    -- its segments (created_at rises with base_offset), so the cost follows what is evictable.
    SELECT s.partition_id, s.base_offset, s.end_offset, p.queue_id
      FROM queen.queues q
      JOIN queen.log_partitions p ON p.queue_id = q.id
     CROSS JOIN LATERAL (SELECT min(lc.cursor_offset) AS low
                           FROM queen.log_consumers lc WHERE lc.partition_id = p.id) AS c
     CROSS JOIN LATERAL (
            SELECT s.partition_id, s.base_offset, s.end_offset, s.created_at
              FROM queen.log_segments s
             WHERE s.partition_id = p.id
               AND s.base_offset < coalesce(c.low, 9223372036854775807)
               AND (c.low IS NULL OR s.end_offset <= c.low)
               AND ((q.retention_seconds > 0
                     AND s.created_at < p_now - make_interval(secs => q.retention_seconds))
                    OR (q.completed_retention_seconds > 0 AND c.low IS NOT NULL
                        AND s.created_at < p_now - make_interval(secs => q.completed_retention_seconds)))
               AND NOT EXISTS (SELECT 1 FROM queen.log_dlq d
                                WHERE d.partition_id = s.partition_id AND d.payload IS NULL
                                  AND d.msg_offset >= s.base_offset AND d.msg_offset < s.end_offset)
             ORDER BY s.base_offset
             LIMIT greatest(p_limit, 1)) AS s
     WHERE (q.retention_seconds > 0 OR q.completed_retention_seconds > 0)
       AND (p_partitions IS NULL OR p.id = ANY (p_partitions))
     ORDER BY s.created_at, s.partition_id, s.base_offset
     LIMIT greatest(p_limit, 1);
$$;

-- queen.retention_v1: delete whole evictable segments and the hashes of their messages.
--
-- Called by: the retention job (queen_pg/jobs/retention.py).
-- Inputs:  p_limit (most segments deleted), p_now (NULL = clock_timestamp()).
-- Result:  one row (segments deleted, log_txns rows deleted); (0, 0) when nothing was evictable or
--          another replica holds RETENTION_LOCK.
-- Locks:   (docs/architecture.md#lock-order) RETENTION_LOCK (try); then, for the partitions holding candidates, their
--          queues FOR KEY SHARE ascending id (#1: conflicts only with the FOR UPDATE that creates a
--          consumer group, so a group created meanwhile is either seen or starts after the delete)
--          and the partitions FOR NO KEY UPDATE ascending id (#2: the push write lock, so a push
--          upserting a hash never meets the delete halfway), then their log_consumers rows FOR KEY
--          SHARE ascending (partition_id, group) (#3: conflicts with the FOR UPDATE of a seek, which
--          moves a cursor back to the first retained segment and so must not read a segment this
--          call deletes; a pop skips these rows for the few milliseconds it takes, an ack waits);
--          the segments and hashes deleted.
-- Guarantees: which segments are evictable is decided again after the locks are held (see
--          queen._evictable_segments), oldest first, at most p_limit; a segment and the log_txns
--          rows whose msg_offset lies in its range go in one transaction (acks resolve
--          transactionIds through log_txns, so a hash only goes with its segment). A cursor never
--          points into a deleted range: every cursor is past it when decided under the locks, and
--          what moves a cursor back or creates one (seek, a new group) waits for those locks.
--          The dedup window of an evicted message ends with it.

CREATE OR REPLACE FUNCTION queen.retention_v1(p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (segments integer, txns integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := coalesce(p_now, clock_timestamp());
    v_pids bigint[];
    v_qids bigint[];
BEGIN
    IF NOT pg_try_advisory_xact_lock(7781200102) THEN  -- RETENTION_LOCK
        RETURN QUERY SELECT 0, 0;
        RETURN;
    END IF;
    SELECT array_agg(DISTINCT e.partition_id), array_agg(DISTINCT e.queue_id) INTO v_pids, v_qids
      FROM queen._evictable_segments(v_now, p_limit, NULL) e;
    IF v_pids IS NULL THEN
        RETURN QUERY SELECT 0, 0;
        RETURN;
    END IF;
    PERFORM 1 FROM queen.queues q WHERE q.id = ANY (v_qids) ORDER BY q.id FOR KEY SHARE;
    PERFORM 1 FROM queen.log_partitions p WHERE p.id = ANY (v_pids) ORDER BY p.id FOR NO KEY UPDATE;
    PERFORM 1 FROM queen.log_consumers lc WHERE lc.partition_id = ANY (v_pids)
     ORDER BY lc.partition_id, lc.consumer_group FOR KEY SHARE;

    -- A new statement, so a new snapshot: decided again under the locks.
    RETURN QUERY
    WITH ev AS (
        SELECT e.partition_id, e.base_offset FROM queen._evictable_segments(v_now, p_limit, v_pids) e
    ), gone AS (
        DELETE FROM queen.log_segments s
         USING ev
         WHERE s.partition_id = ev.partition_id AND s.base_offset = ev.base_offset
        RETURNING s.partition_id, s.base_offset, s.end_offset, s.created_at
    ), hashes AS (
        DELETE FROM queen.log_txns t
         USING gone g
         WHERE t.partition_id = g.partition_id
           AND t.msg_offset >= g.base_offset AND t.msg_offset < g.end_offset
           -- a hash is stamped with its segment's time: this bound lets the BRIN index skip the
           -- newer part of the table
           AND t.created_at <= (SELECT max(g2.created_at) FROM gone g2)
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM gone)::integer, (SELECT count(*) FROM hashes)::integer;
END;
$$;

-- queen.dlq_fill_v2: write decoded dead-letter payloads, then hand out the next ones to decode.
--
-- Called by: the dlq_fill job (queen_pg/jobs/dlq_fill.py). ack_v1 dead-letters a message with
--          payload NULL because the payload sits in its segment as a QPF1 frame (zstd-compressed,
--          codec 1, or raw, codec 0); the broker decodes it and this call stores it.
-- Inputs:  index-aligned, the previous batch (empty arrays on the first call): p_ids[i] the log_dlq
--          row; p_payloads[i] its payload as JSON text; p_sealed[i] the payload as its frame had it
--          when the frame is sealed (an encrypted queue: queen_pg/security/crypto.py), else NULL;
--          p_subs[i] the frame's producerSub (NULL: none). p_limit (most rows handed out); p_now,
--          unused today (no decision here reads the clock), kept so every job procedure ends in
--          (p_limit, p_now).
-- Result:  the next up to p_limit rows still NULL, ascending id: (id, partition_id, msg_offset, the
--          segment holding it: base_offset, dropped, codec, payload). The segment's payload is sent on
--          the first row of that segment only (NULL on the others: same blob); base_offset NULL =
--          the segment is gone. No rows = nothing left, or another replica holds DLQ_FILL_LOCK
--          (then nothing was written either: the batch is handed out again later).
-- Locks:   (docs/architecture.md#lock-order) DLQ_FILL_LOCK (try); the log_dlq rows written (no other procedure
--          locks log_dlq rows).
-- Guarantees: a payload is written only where it is still NULL, so a repeated batch changes
--          nothing. A sealed row gets payload = JSON null (filled: no plaintext is copied into
--          log_dlq) and `sealed` = the sealed bytes; every row gets producer_sub. Retention keeps a
--          segment while one of its dead letters is NULL. A payload jsonb refuses (a \u0000 escape, a
--          number past numeric's range, not JSON at all) is stored as a JSON string holding its text,
--          so one bad message never blocks the job.
-- Errors:  none of its own.
CREATE OR REPLACE FUNCTION queen.dlq_fill_v2(
    p_ids      bigint[],
    p_payloads text[],
    p_sealed   bytea[],
    p_subs     text[],
    p_limit    integer,
    p_now      timestamptz DEFAULT NULL
) RETURNS TABLE (id bigint, partition_id bigint, msg_offset bigint, base_offset bigint, dropped integer[],
                 codec smallint, payload bytea)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF NOT pg_try_advisory_xact_lock(7781200103) THEN  -- DLQ_FILL_LOCK
        RETURN;
    END IF;
    BEGIN
        UPDATE queen.log_dlq d
           SET payload = CASE WHEN u.seal IS NULL THEN u.body::jsonb ELSE 'null'::jsonb END,
               sealed = u.seal, producer_sub = u.sub
          FROM unnest(p_ids, p_payloads, p_sealed, p_subs) AS u(dlq_id, body, seal, sub)
         WHERE d.id = u.dlq_id AND d.payload IS NULL;
    EXCEPTION WHEN data_exception THEN
        FOR r IN SELECT u.dlq_id, u.body, u.seal, u.sub
                   FROM unnest(p_ids, p_payloads, p_sealed, p_subs) AS u(dlq_id, body, seal, sub) LOOP
            BEGIN
                UPDATE queen.log_dlq d
                   SET payload = CASE WHEN r.seal IS NULL THEN r.body::jsonb ELSE 'null'::jsonb END,
                       sealed = r.seal, producer_sub = r.sub
                 WHERE d.id = r.dlq_id AND d.payload IS NULL;
            EXCEPTION WHEN data_exception THEN
                UPDATE queen.log_dlq d SET payload = to_jsonb(r.body), producer_sub = r.sub
                 WHERE d.id = r.dlq_id AND d.payload IS NULL;
            END;
        END LOOP;
    END;

    RETURN QUERY
    SELECT n.id, n.partition_id, n.msg_offset, s.base_offset, s.dropped, s.codec,
           CASE WHEN row_number() OVER (PARTITION BY s.partition_id, s.base_offset ORDER BY n.id) = 1
                THEN s.payload END
      FROM (SELECT d.id, d.partition_id, d.msg_offset
              FROM queen.log_dlq d
             WHERE d.payload IS NULL
             ORDER BY d.id
             LIMIT greatest(p_limit, 1)) AS n
      LEFT JOIN LATERAL (
            SELECT s.partition_id, s.base_offset, s.end_offset, s.dropped, s.codec, s.payload
              FROM queen.log_segments s
             WHERE s.partition_id = n.partition_id AND s.base_offset <= n.msg_offset
             ORDER BY s.base_offset DESC
             LIMIT 1) AS s ON s.end_offset > n.msg_offset
     ORDER BY n.id;
END;
$$;
