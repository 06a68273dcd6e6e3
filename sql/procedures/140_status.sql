-- Status and analytics: the overview with recent throughput, per-queue status, the per-minute time
-- series written by the stats job (queen.stats_minutes, sql/procedures/130_system.sql), and the consumer
-- groups that lag behind.
--
-- Reads only: no locks (docs/architecture.md#lock-order), STABLE; jsonb built for the HTTP answer, timestamps via
-- queen._iso_utc. Terms (messages, backlog, inFlight, lag) as in sql/procedures/100_resources.sql.
-- Throughput comes from stats_minutes, so it trails the live counters by up to one stats tick (a few
-- seconds). A bucket with no sample reads pushed 0, acked 0, backlog and lagSeconds null.
--
-- queen._queue_lag_seconds(queue_id, now) -> double precision: age at `now` of the oldest message any
--   group of the queue has not done (NULL: none). One primary-key probe into log_segments per lagging
--   cursor row.
-- queen.status_v1(tenant, now) -> jsonb
--   Called by GET /api/v1/status: queen.resources_overview_v1 (a snapshot read: "asOf") plus
--   "maintenance" {"push","pop"}, "throughput" {"lastMinute": {"minute","pushed","acked"} (the last
--   complete minute), "lastHour": {"pushed","acked"}} from queen.tenant_minutes (at most 61 rows, the
--   per-tenant sums the stats job adds with each sample), never from the per-queue rows.
-- queen.status_queues_v1(tenant, from, to, limit, offset, now) -> jsonb
--   Called by GET /api/v1/status/queues: {"queues":[{name, namespace, task, the queue summary,
--   "lagSeconds", "throughput": {"pushed","acked"} over [from, to)}],"total","limit","offset","from","to"}.
-- queen.status_queue_v1(tenant, queue, from, to, bucket_seconds, now) -> jsonb | NULL
--   Called by GET /api/v1/status/queues/{queue}: the queue's detail (queen.resources_queue_v1 without
--   the partition page), "lagSeconds", and "series"/"totals" as queen.analytics_v1 for that queue.
-- queen.analytics_v1(tenant, queue, from, to, bucket_seconds, now) -> jsonb
--   Called by GET /api/v1/status/analytics: one entry per bucket (aligned to the epoch) from `from` to
--   `to`: {"time","pushed","acked","backlog","lagSeconds"}. Queue NULL (the whole tenant): read from
--   queen.tenant_minutes (one row per minute, whatever the number of queues): pushed and acked summed
--   over the bucket's minutes; backlog = the largest of the minutes' tenant backlogs (each the sum of
--   every queue's last sampled backlog); lagSeconds = the largest lag. One queue: its stats_minutes
--   rows the same way; a bucket without a row of the queue in which the stats job ran (the tenant has a
--   row: the queue was idle, so it was not sampled) carries the queue's previous row's backlog, and that
--   row's lag grown by the time since. Plus
--   "totals" {"pushed","acked"}. {"notFound":"queue"} for an unknown queue. The broker bounds the
--   number of buckets.
-- queen.consumer_groups_lagging_v1(tenant, min_lag_seconds, limit, offset, now) -> jsonb
--   Called by GET /api/v1/consumer-groups/lagging: the (queue, group) pairs whose oldest pending
--   message is at least min_lag_seconds old, oldest first: {"groups":[{"name","queueMode","queue",
--   "partitions","partitionsBehind","lag","oldestPendingAt","lagSeconds"}],"total","limit","offset",
--   "minLagSeconds","asOf"}. Read from the tenant's snapshot (queen.group_lag, written with its
--   tenant_stats row by the stats_snapshot job, sql/procedures/098_stats_snapshot.sql): the rows old
--   enough through the (tenant, oldest) index, so the cost is the answer's, not the number of cursor
--   rows; partitions, partitionsBehind and lag are as of "asOf", lagSeconds at `now`. A tenant
--   without a snapshot row yet is computed live (every cursor row; the oldest pending message of a
--   cursor row is its maintained head_at), with asOf = now.

CREATE OR REPLACE FUNCTION queen._queue_lag_seconds(p_queue_id bigint, p_now timestamptz)
RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT extract(epoch FROM p_now - min((SELECT s.created_at FROM queen.log_segments s
                                             WHERE s.partition_id = lc.partition_id
                                               AND s.base_offset <= lc.cursor_offset
                                             ORDER BY s.base_offset DESC LIMIT 1)))::double precision
      FROM queen.log_consumers lc JOIN queen.log_partitions p ON p.id = lc.partition_id
     WHERE lc.queue_id = p_queue_id AND lc.cursor_offset < p.next_offset
$$;

CREATE OR REPLACE FUNCTION queen.status_v1(p_tenant text, p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    WITH clock AS (SELECT coalesce(p_now, now()) AS now,
                          date_trunc('minute', coalesce(p_now, now())) - interval '1 minute' AS last_minute),
    settings AS (SELECT queen.system_settings_v1() AS s)
    SELECT queen.resources_overview_v1(p_tenant, (SELECT clock.now FROM clock))
           || jsonb_build_object(
               'maintenance', jsonb_build_object(
                   'push', coalesce(((SELECT settings.s FROM settings) ->> 'maintenance.push')::boolean, false),
                   'pop', coalesce(((SELECT settings.s FROM settings) ->> 'maintenance.pop')::boolean, false)),
               'throughput', jsonb_build_object(
                   'lastMinute', (SELECT jsonb_build_object('minute', queen._iso_utc(clock.last_minute),
                                                            'pushed', coalesce(sum(s.pushed), 0),
                                                            'acked', coalesce(sum(s.acked), 0))
                                    FROM clock LEFT JOIN queen.tenant_minutes s
                                      ON s.tenant = p_tenant AND s.minute = clock.last_minute
                                   GROUP BY clock.last_minute),
                   'lastHour', (SELECT jsonb_build_object('pushed', coalesce(sum(s.pushed), 0),
                                                          'acked', coalesce(sum(s.acked), 0))
                                  FROM clock LEFT JOIN queen.tenant_minutes s
                                    ON s.tenant = p_tenant AND s.minute > clock.now - interval '1 hour')))
$$;

CREATE OR REPLACE FUNCTION queen.status_queues_v1(
    p_tenant text, p_from timestamptz, p_to timestamptz, p_limit integer, p_offset integer,
    p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    WITH m AS (
        SELECT q.id, q.name, q.namespace, q.task, q.created_at FROM queen.queues q WHERE q.tenant = p_tenant
    ), page AS (
        SELECT m.* FROM m ORDER BY m.name LIMIT greatest(p_limit, 0) OFFSET greatest(p_offset, 0)
    )
    SELECT jsonb_build_object(
        'total', (SELECT count(*) FROM m), 'limit', p_limit, 'offset', p_offset,
        'from', queen._iso_utc(p_from), 'to', queen._iso_utc(p_to),
        'queues', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                       'lagSeconds', queen._queue_lag_seconds(page.id, coalesce(p_now, now())),
                       'throughput', (SELECT jsonb_build_object('pushed', coalesce(sum(s.pushed), 0),
                                                                'acked', coalesce(sum(s.acked), 0))
                                        FROM queen.stats_minutes s
                                       WHERE s.queue_id = page.id AND s.minute >= date_trunc('minute', p_from)
                                         AND s.minute < p_to))
                             || queen._queue_entry(page.id, page.name, page.namespace, page.task, page.created_at,
                                                   coalesce(p_now, now())) ORDER BY page.name)
              FROM page), '[]'::jsonb))
$$;

CREATE OR REPLACE FUNCTION queen.analytics_v1(
    p_tenant text, p_queue text, p_from timestamptz, p_to timestamptz, p_bucket_seconds integer,
    p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    WITH q AS (
        SELECT q.id FROM queen.queues q WHERE q.tenant = p_tenant AND q.name = p_queue
    ), w AS (
        SELECT make_interval(secs => p_bucket_seconds) AS step,
               date_bin(make_interval(secs => p_bucket_seconds), p_from, '1970-01-01 00:00:00+00') AS start
    ), minutes AS (
        -- the whole tenant: its own rows (throughput and the backlog/lag over every queue's last sample)
        SELECT t.minute, t.pushed, t.acked, t.backlog, t.lag_seconds
          FROM queen.tenant_minutes t, w
         WHERE p_queue IS NULL AND t.tenant = p_tenant AND t.minute >= w.start AND t.minute < p_to
        UNION ALL
        -- one queue: its rows, written by the samples it had (only when it moved)
        SELECT s.minute, s.pushed, s.acked, s.backlog, s.lag_seconds
          FROM queen.stats_minutes s, w
         WHERE p_queue IS NOT NULL AND s.queue_id = (SELECT q.id FROM q)
           AND s.minute >= w.start AND s.minute < p_to
    ), agg AS (
        SELECT date_bin(w.step, m.minute, '1970-01-01 00:00:00+00') AS t, sum(m.pushed) AS pushed,
               sum(m.acked) AS acked, max(m.backlog) AS backlog, max(m.lag_seconds) AS lag_seconds
          FROM minutes m, w GROUP BY 1
    ), buckets AS (
        SELECT b.t FROM w, generate_series(w.start, p_to - interval '1 microsecond', w.step) AS b(t)
    ), filled AS (
        -- one queue, a bucket in which the stats job ran (the tenant has a row) but did not sample the
        -- queue: it was idle, so its backlog is its last sample's and its lag that one's grown since
        SELECT buckets.t, agg.pushed, agg.acked,
               CASE WHEN agg.t IS NOT NULL THEN agg.backlog ELSE prev.backlog END AS backlog,
               CASE WHEN agg.t IS NOT NULL THEN agg.lag_seconds
                    ELSE prev.lag_seconds + extract(epoch FROM buckets.t - prev.minute)::double precision END
                   AS lag_seconds
          FROM w CROSS JOIN buckets LEFT JOIN agg ON agg.t = buckets.t
          LEFT JOIN LATERAL (
               SELECT s.minute, s.backlog, s.lag_seconds FROM queen.stats_minutes s
                WHERE p_queue IS NOT NULL AND agg.t IS NULL
                  AND s.queue_id = (SELECT q.id FROM q) AND s.minute < buckets.t
                  AND EXISTS (SELECT 1 FROM queen.tenant_minutes t
                               WHERE t.tenant = p_tenant AND t.minute >= buckets.t
                                 AND t.minute < buckets.t + w.step AND t.backlog IS NOT NULL)
                ORDER BY s.minute DESC LIMIT 1) AS prev ON true
    )
    SELECT CASE WHEN p_queue IS NOT NULL AND NOT EXISTS (SELECT 1 FROM q)
           THEN jsonb_build_object('notFound', 'queue') ELSE
           jsonb_build_object(
               'queue', p_queue, 'from', queen._iso_utc(p_from), 'to', queen._iso_utc(p_to),
               'bucketSeconds', p_bucket_seconds,
               'series', coalesce((
                   SELECT jsonb_agg(jsonb_build_object(
                              'time', queen._iso_utc(filled.t), 'pushed', coalesce(filled.pushed, 0),
                              'acked', coalesce(filled.acked, 0), 'backlog', filled.backlog,
                              'lagSeconds', filled.lag_seconds) ORDER BY filled.t)
                     FROM filled), '[]'::jsonb),
               'totals', jsonb_build_object('pushed', (SELECT coalesce(sum(agg.pushed), 0) FROM agg),
                                            'acked', (SELECT coalesce(sum(agg.acked), 0) FROM agg))) END
$$;

CREATE OR REPLACE FUNCTION queen.status_queue_v1(
    p_tenant text, p_queue text, p_from timestamptz, p_to timestamptz, p_bucket_seconds integer,
    p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT d - 'partitions' - 'limit' - 'offset'
           || jsonb_build_object(
               'lagSeconds', queen._queue_lag_seconds(
                   (SELECT q.id FROM queen.queues q WHERE q.tenant = p_tenant AND q.name = p_queue),
                   coalesce(p_now, now())),
               'from', a -> 'from', 'to', a -> 'to', 'bucketSeconds', a -> 'bucketSeconds',
               'series', a -> 'series', 'totals', a -> 'totals')
      FROM (SELECT queen.resources_queue_v1(p_tenant, p_queue, 0, 0, p_now) AS d,
                   queen.analytics_v1(p_tenant, p_queue, p_from, p_to, p_bucket_seconds, p_now) AS a) AS x
     WHERE d IS NOT NULL
$$;

CREATE OR REPLACE FUNCTION queen._lagging_live(p_tenant text)
RETURNS TABLE (queue_id bigint, consumer_group text, partitions bigint, behind bigint, lag bigint,
               oldest timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT lc.queue_id, lc.consumer_group, count(*), count(*) FILTER (WHERE lc.cursor_offset < p.next_offset),
           sum(greatest(p.next_offset - lc.cursor_offset, 0))::bigint,
           min(lc.head_at) FILTER (WHERE lc.cursor_offset < p.next_offset)
      FROM queen.log_consumers lc JOIN queen.log_partitions p ON p.id = lc.partition_id
     WHERE lc.tenant = p_tenant
     GROUP BY lc.queue_id, lc.consumer_group
$$;

CREATE OR REPLACE FUNCTION queen.consumer_groups_lagging_v1(
    p_tenant text, p_min_lag_seconds integer, p_limit integer, p_offset integer, p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
-- plpgsql, not sql: only the branch taken is planned (the snapshot read stays an index range scan)
DECLARE
    v_now    timestamptz := coalesce(p_now, now());
    v_cut    timestamptz := coalesce(p_now, now()) - make_interval(secs => p_min_lag_seconds);
    v_as_of  timestamptz;
    v_total  bigint;
    v_groups jsonb;
BEGIN
    SELECT s.as_of INTO v_as_of FROM queen.tenant_stats s WHERE s.tenant = p_tenant;
    IF FOUND THEN
        SELECT count(*) INTO v_total FROM queen.group_lag g WHERE g.tenant = p_tenant AND g.oldest <= v_cut;
        SELECT coalesce(jsonb_agg(x.j ORDER BY x.oldest, x.queue, x.consumer_group), '[]'::jsonb) INTO v_groups
          FROM (SELECT g.oldest, g.queue, g.consumer_group,
                       queen._lagging_entry(g.consumer_group, g.queue, g.partitions, g.behind, g.lag, g.oldest, v_now)
                           AS j
                  FROM queen.group_lag g
                 WHERE g.tenant = p_tenant AND g.oldest <= v_cut
                 ORDER BY g.oldest, g.queue, g.consumer_group
                 LIMIT greatest(p_limit, 0) OFFSET greatest(p_offset, 0)) AS x;
    ELSE
        v_as_of := v_now;  -- no snapshot yet (a new tenant, or before the job's first tick): live
        SELECT count(*) INTO v_total FROM queen._lagging_live(p_tenant) l WHERE l.oldest <= v_cut;
        SELECT coalesce(jsonb_agg(x.j ORDER BY x.oldest, x.queue, x.consumer_group), '[]'::jsonb) INTO v_groups
          FROM (SELECT l.oldest, q.name AS queue, l.consumer_group,
                       queen._lagging_entry(l.consumer_group, q.name, l.partitions, l.behind, l.lag, l.oldest, v_now)
                           AS j
                  FROM queen._lagging_live(p_tenant) l JOIN queen.queues q ON q.id = l.queue_id
                 WHERE l.oldest <= v_cut
                 ORDER BY l.oldest, q.name, l.consumer_group
                 LIMIT greatest(p_limit, 0) OFFSET greatest(p_offset, 0)) AS x;
    END IF;
    RETURN jsonb_build_object('total', v_total, 'limit', p_limit, 'offset', p_offset,
                              'minLagSeconds', p_min_lag_seconds, 'groups', v_groups,
                              'asOf', queen._iso_utc(v_as_of));
END;
$$;

CREATE OR REPLACE FUNCTION queen._lagging_entry(
    p_group text, p_queue text, p_partitions bigint, p_behind bigint, p_lag bigint, p_oldest timestamptz,
    p_now timestamptz)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'name', queen._group_out(p_group), 'queueMode', queen._queue_mode(p_group), 'queue', p_queue,
        'partitions', p_partitions, 'partitionsBehind', p_behind, 'lag', p_lag,
        'oldestPendingAt', queen._iso_utc(p_oldest), 'lagSeconds', extract(epoch FROM p_now - p_oldest))
$$;
