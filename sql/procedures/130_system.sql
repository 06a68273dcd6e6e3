-- System switches (maintenance) and the stats job that fills queen.stats_minutes.
--
-- queen.system_settings_v1() -> jsonb
--   Called by: the maintenance refresher of every broker process (queen_pg/jobs/maintenance.py, at
--   least once a second) and GET /api/v1/system/maintenance[/pop]. Every switch as
--   {"<key>": value, ..., "updatedAt": <latest change>}; a key never set is absent (= off).
--   Locks: none (a read).
-- queen.system_setting_set_v1(key, value jsonb, now) -> jsonb
--   Called by: POST /api/v1/system/maintenance (key 'maintenance.push') and .../maintenance/pop
--   ('maintenance.pop'). Upserts the key and answers system_settings_v1() as seen after the write.
--   Locks: the system_settings row (INSERT ... ON CONFLICT DO UPDATE); no other lock is held with it.
--
-- queen.stats_sample_v1(limit, min_gap_seconds, keep_seconds, now) -> (queues, pruned)
--   Called by: the stats job (queen_pg/jobs/stats.py), every few seconds. Samples up to `limit` queues
--   never sampled, or not sampled in the last min_gap_seconds AND active since (their pushed or acked
--   counter, or their cursors' sum(cursor_offset + 1), differs from their mark; found by one hashed pass over log_partitions and one over
--   log_consumers, so an idle queue costs no sample and no write): never sampled first, then the
--   longest ago. An idle queue keeps its mark (counters, backlog, oldest pending) and writes no
--   stats_minutes row; its growth, if any, is counted whenever it is next sampled. It reads the
--   queue's counters, pushed_total = sum(log_partitions.next_offset) and acked_total =
--   sum(log_consumers.acked_total) (every message settled by any group: completed or dead-lettered),
--   adds their growth since the queue's previous sample (queen.stats_marks; a counter that went down,
--   e.g. a deleted group, counts 0) to the row of the current minute, and records the backlog
--   (largest group lag; retained messages when the queue has no group) and lag_seconds (age at `now`
--   of the oldest message some group has not done; NULL when none) of the sample as that minute's.
--   A queue sampled for the first time counts its whole history only when it was created less than a
--   minute ago (a new queue); an older one (e.g. from before this job existed) starts from its current
--   counters. The sample's growth is also added, summed per tenant, to queen.tenant_minutes (what
--   GET /api/v1/status reads), and every call sets each tenant's row of the minute's backlog (sum of the
--   marks' backlogs) and lag_seconds (age of the oldest pending message over the marks): what
--   GET /api/v1/status/analytics reads for a whole tenant (a pass over stats_marks). Then deletes up to `limit` stats rows (and tenant_minutes rows) older
--   than keep_seconds (<= 0: kept forever).
--   Result: one row (queues sampled, rows pruned); (0, 0) when another replica holds STATS_LOCK.
--   Locks (docs/architecture.md#lock-order): STATS_LOCK (try); the stats_marks, stats_minutes and tenant_minutes rows
--   written. The
--   counters are read without locks (a push or ack committing meanwhile lands in the next sample).

CREATE OR REPLACE FUNCTION queen.system_settings_v1()
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_object_agg(s.key, s.value), '{}'::jsonb)
           || jsonb_build_object('updatedAt', queen._iso_utc(max(s.updated_at)))
      FROM queen.system_settings s
$$;

CREATE OR REPLACE FUNCTION queen.system_setting_set_v1(p_key text, p_value jsonb, p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queen.system_settings AS s (key, value, updated_at)
    VALUES (p_key, p_value, coalesce(p_now, clock_timestamp()))
    ON CONFLICT ON CONSTRAINT system_settings_pkey DO UPDATE
       SET value = excluded.value, updated_at = excluded.updated_at;
    RETURN queen.system_settings_v1();
END;
$$;

CREATE OR REPLACE FUNCTION queen.stats_sample_v1(
    p_limit integer, p_min_gap_seconds integer, p_keep_seconds integer, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (queues integer, pruned integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := coalesce(p_now, clock_timestamp());
    v_minute timestamptz := date_trunc('minute', v_now);
    v_n      integer;
    v_pruned integer := 0;
BEGIN
    IF NOT pg_try_advisory_xact_lock(7781200170) THEN  -- STATS_LOCK
        RETURN QUERY SELECT 0, 0;
        RETURN;
    END IF;

    -- the queues whose counters moved since their mark: two sequential passes (one per counter table,
    -- hashed by queue), not one probe per queue, so an idle queue costs a row read and no sample
    WITH pushed_now AS (
        SELECT p.queue_id, sum(p.next_offset)::bigint AS pushed FROM queen.log_partitions p GROUP BY p.queue_id
    ), acked_now AS (
        SELECT lc.queue_id, sum(lc.acked_total)::bigint AS acked, sum(lc.cursor_offset + 1)::bigint AS cursors
          FROM queen.log_consumers lc GROUP BY lc.queue_id
    ), k AS (
        SELECT q.id, q.tenant, q.created_at, m.pushed_total AS m_pushed, m.acked_total AS m_acked
          FROM queen.queues q
          LEFT JOIN queen.stats_marks m ON m.queue_id = q.id
          LEFT JOIN pushed_now pn ON pn.queue_id = q.id
          LEFT JOIN acked_now an ON an.queue_id = q.id
         WHERE m.sampled_at IS NULL OR m.backlog IS NULL
            OR (m.sampled_at <= v_now - make_interval(secs => p_min_gap_seconds)
                AND (coalesce(pn.pushed, 0) <> m.pushed_total OR coalesce(an.acked, 0) <> m.acked_total
                     -- a cursor created, deleted or moved without an ack (clear, seek, a group deleted)
                     OR coalesce(an.cursors, 0) IS DISTINCT FROM m.cursors_total))
         ORDER BY m.sampled_at NULLS FIRST, q.id
         LIMIT greatest(p_limit, 1)
    ), cur AS (
        SELECT k.id, k.tenant, w.pushed, a.acked, a.cursors,
               CASE WHEN k.m_pushed IS NOT NULL THEN greatest(w.pushed - k.m_pushed, 0)
                    WHEN k.created_at > v_now - interval '1 minute' THEN w.pushed ELSE 0 END AS d_pushed,
               CASE WHEN k.m_acked IS NOT NULL THEN greatest(a.acked - k.m_acked, 0)
                    WHEN k.created_at > v_now - interval '1 minute' THEN a.acked ELSE 0 END AS d_acked,
               coalesce(g.backlog, w.retained) AS backlog, g.oldest,
               extract(epoch FROM v_now - g.oldest)::double precision AS lag_seconds
          FROM k
         CROSS JOIN LATERAL (
               SELECT coalesce(sum(p.next_offset), 0)::bigint AS pushed,
                      coalesce(sum(p.next_offset - coalesce((SELECT s.base_offset FROM queen.log_segments s
                                                              WHERE s.partition_id = p.id
                                                              ORDER BY s.base_offset LIMIT 1), p.next_offset)),
                               0)::bigint AS retained
                 FROM queen.log_partitions p WHERE p.queue_id = k.id) AS w
         CROSS JOIN LATERAL (
               SELECT coalesce(sum(lc.acked_total), 0)::bigint AS acked,
                      coalesce(sum(lc.cursor_offset + 1), 0)::bigint AS cursors
                 FROM queen.log_consumers lc WHERE lc.queue_id = k.id) AS a
         CROSS JOIN LATERAL (
               SELECT max(per.lag)::bigint AS backlog, min(per.oldest) AS oldest
                 FROM (SELECT sum(p.next_offset - lc.cursor_offset) AS lag,
                              min((SELECT s.created_at FROM queen.log_segments s
                                    WHERE s.partition_id = lc.partition_id AND s.base_offset <= lc.cursor_offset
                                    ORDER BY s.base_offset DESC LIMIT 1))
                                  FILTER (WHERE lc.cursor_offset < p.next_offset) AS oldest
                         FROM queen.log_consumers lc JOIN queen.log_partitions p ON p.id = lc.partition_id
                        WHERE lc.queue_id = k.id
                        GROUP BY lc.consumer_group) AS per) AS g
    ), marks AS (
        INSERT INTO queen.stats_marks AS m (queue_id, pushed_total, acked_total, sampled_at, backlog, oldest_at,
                                            cursors_total)
        SELECT cur.id, cur.pushed, cur.acked, v_now, cur.backlog, cur.oldest, cur.cursors FROM cur ORDER BY cur.id
        ON CONFLICT ON CONSTRAINT stats_marks_pkey DO UPDATE
           SET pushed_total = excluded.pushed_total, acked_total = excluded.acked_total,
               sampled_at = excluded.sampled_at, backlog = excluded.backlog, oldest_at = excluded.oldest_at,
               cursors_total = excluded.cursors_total
        RETURNING 1
    ), tenant_minutes AS (
        INSERT INTO queen.tenant_minutes AS t (tenant, minute, pushed, acked)
        SELECT cur.tenant, v_minute, sum(cur.d_pushed), sum(cur.d_acked)
          FROM cur GROUP BY cur.tenant HAVING sum(cur.d_pushed) + sum(cur.d_acked) > 0 ORDER BY cur.tenant
        ON CONFLICT ON CONSTRAINT tenant_minutes_pkey DO UPDATE
           SET pushed = t.pushed + excluded.pushed, acked = t.acked + excluded.acked
    ), minutes AS (
        INSERT INTO queen.stats_minutes AS s (queue_id, minute, tenant, pushed, acked, backlog, lag_seconds)
        SELECT cur.id, v_minute, cur.tenant, cur.d_pushed, cur.d_acked, cur.backlog, cur.lag_seconds
          FROM cur ORDER BY cur.id
        ON CONFLICT ON CONSTRAINT stats_minutes_pkey DO UPDATE
           SET pushed = s.pushed + excluded.pushed, acked = s.acked + excluded.acked,
               backlog = excluded.backlog, lag_seconds = excluded.lag_seconds
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM marks) INTO v_n;

    -- each tenant's backlog and lag of this minute, over every queue's last sample (an idle queue keeps
    -- its mark's): what GET /api/v1/status/analytics reads for the whole tenant (one row per minute)
    INSERT INTO queen.tenant_minutes AS t (tenant, minute, backlog, lag_seconds)
    SELECT q.tenant, v_minute, sum(m.backlog)::bigint,
           extract(epoch FROM v_now - min(m.oldest_at))::double precision
      FROM queen.stats_marks m JOIN queen.queues q ON q.id = m.queue_id
     GROUP BY q.tenant ORDER BY q.tenant
    ON CONFLICT ON CONSTRAINT tenant_minutes_pkey DO UPDATE
       SET backlog = excluded.backlog, lag_seconds = excluded.lag_seconds;

    IF p_keep_seconds > 0 THEN
        DELETE FROM queen.stats_minutes s
         WHERE (s.queue_id, s.minute) IN (
               SELECT o.queue_id, o.minute FROM queen.stats_minutes o
                WHERE o.minute < v_now - make_interval(secs => p_keep_seconds)
                ORDER BY o.minute LIMIT greatest(p_limit, 1));
        GET DIAGNOSTICS v_pruned = ROW_COUNT;
        DELETE FROM queen.tenant_minutes t
         WHERE (t.tenant, t.minute) IN (
               SELECT o.tenant, o.minute FROM queen.tenant_minutes o
                WHERE o.minute < v_now - make_interval(secs => p_keep_seconds)
                ORDER BY o.minute LIMIT greatest(p_limit, 1));
    END IF;
    RETURN QUERY SELECT v_n, v_pruned;
END;
$$;
