-- Metrics: what GET /metrics reads from the database, in one call per scrape.
--
-- queen.metrics_snapshot_v1(p_now) -> rows
--   Called by: the previous release's GET /metrics (0.x brokers), at most once a
--   second per broker process (the answer is cached for a second).
--   Result: one row per queue with consumer_group NULL: partitions, messages (every offset ever
--   given: sum of next_offset), dlq (dead letters of the queue); and one row per (queue, consumer
--   group), queue mode as '__QUEUE_MODE__': partitions (cursor rows), lag (messages not yet done:
--   next_offset - cursor_offset summed over the group's partitions), lag_seconds (age at p_now of the
--   oldest message not yet done; 0 when lag is 0), leased_partitions (live leases at p_now), dlq (the
--   group's dead letters). messages is NULL on group rows; lag, lag_seconds and leased_partitions
--   are NULL on queue rows.
--   Cost: one pass over queues, log_partitions, log_groups, log_consumers and the log_dlq index, plus
--   one primary-key probe into log_segments per lagging cursor row (for lag_seconds).
--   Locks: none (plain reads under MVCC); see docs/locks.md.
--
--   Kept for the previous release's brokers (a rolling deploy); this release's GET /metrics reads the
--   per-tenant snapshot (queen.metrics_tenants_v1, sql/procedures/098_stats_snapshot.sql) and
--   GET /metrics/queues one page of queues (queen.metrics_queues_v1).
--
-- queen.metrics_queues_v1(p_tenant, p_limit, p_offset, p_now) -> rows, as metrics_snapshot_v1
--   Called by: GET /metrics/queues (queen_pg/api/routes_metrics.py). The rows of metrics_snapshot_v1
--   for one page of queues, by (tenant, name): tenant NULL = every tenant's. Cost: the page's queues
--   only (their partitions, groups, cursor rows, dead letters by queue_id index; one log_segments
--   probe per lagging cursor row). Locks: none (reads).
--
-- queen.metrics_partition_queues_v1(p_ids) -> rows (partition_id, tenant, queue)
--   Called by the previous release's brokers (metrics of acked messages per queue); kept for a rolling
--   deploy. Ids of deleted partitions are absent from the result. Locks: none (reads).

CREATE OR REPLACE FUNCTION queen.metrics_snapshot_v1(p_now timestamptz DEFAULT NULL)
RETURNS TABLE (tenant text, queue text, consumer_group text, partitions bigint, messages bigint, lag bigint,
               lag_seconds double precision, leased_partitions bigint, dlq bigint)
LANGUAGE sql STABLE AS $$
    WITH clock AS (SELECT coalesce(p_now, now()) AS now),
    parts AS (
        SELECT lp.queue_id, count(*) AS partitions, sum(lp.next_offset)::bigint AS messages
          FROM queen.log_partitions lp
         GROUP BY lp.queue_id),
    dead AS (
        SELECT d.queue_id, d.consumer_group, count(*) AS n
          FROM queen.log_dlq d
         GROUP BY d.queue_id, d.consumer_group),
    cursors AS (
        SELECT lc.queue_id,
               lc.consumer_group,
               count(*) AS partitions,
               sum(lp.next_offset - lc.cursor_offset)::bigint AS lag,
               count(*) FILTER (WHERE lc.lease_id IS NOT NULL AND lc.lease_expires_at > (SELECT now FROM clock))
                   AS leased,
               min((SELECT ls.created_at FROM queen.log_segments ls
                     WHERE ls.partition_id = lc.partition_id AND ls.base_offset <= lc.cursor_offset
                     ORDER BY ls.base_offset DESC LIMIT 1))
                   FILTER (WHERE lc.cursor_offset < lp.next_offset) AS oldest_pending_at
          FROM queen.log_consumers lc
          JOIN queen.log_partitions lp ON lp.id = lc.partition_id
         GROUP BY lc.queue_id, lc.consumer_group)
    SELECT q.tenant, q.name, NULL::text, coalesce(p.partitions, 0), coalesce(p.messages, 0), NULL::bigint,
           NULL::double precision, NULL::bigint,
           coalesce((SELECT sum(d.n) FROM dead d WHERE d.queue_id = q.id), 0)::bigint
      FROM queen.queues q
      LEFT JOIN parts p ON p.queue_id = q.id
    UNION ALL
    SELECT q.tenant, q.name, g.name, coalesce(c.partitions, 0), NULL::bigint, coalesce(c.lag, 0),
           coalesce(greatest(extract(epoch FROM (SELECT now FROM clock) - c.oldest_pending_at), 0), 0)::double precision,
           coalesce(c.leased, 0), coalesce(d.n, 0)
      FROM queen.log_groups g
      JOIN queen.queues q ON q.id = g.queue_id
      LEFT JOIN cursors c ON c.queue_id = g.queue_id AND c.consumer_group = g.name
      LEFT JOIN dead d ON d.queue_id = g.queue_id AND d.consumer_group = g.name
$$;

CREATE OR REPLACE FUNCTION queen.metrics_partition_queues_v1(p_ids bigint[])
RETURNS TABLE (partition_id bigint, tenant text, queue text)
LANGUAGE sql STABLE AS $$
    SELECT lp.id, lp.tenant, q.name
      FROM queen.log_partitions lp
      JOIN queen.queues q ON q.id = lp.queue_id
     WHERE lp.id = ANY (p_ids)
$$;

CREATE OR REPLACE FUNCTION queen.metrics_queues_v1(
    p_tenant text, p_limit integer, p_offset integer, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (tenant text, queue text, consumer_group text, partitions bigint, messages bigint, lag bigint,
               lag_seconds double precision, leased_partitions bigint, dlq bigint)
LANGUAGE sql STABLE AS $$
    WITH clock AS (SELECT coalesce(p_now, now()) AS now),
    page AS (
        SELECT q.id, q.tenant, q.name FROM queen.queues q
         WHERE p_tenant IS NULL OR q.tenant = p_tenant
         ORDER BY q.tenant, q.name LIMIT greatest(p_limit, 0) OFFSET greatest(p_offset, 0)),
    dead AS (
        SELECT d.queue_id, d.consumer_group, count(*) AS n
          FROM page JOIN queen.log_dlq d ON d.queue_id = page.id
         GROUP BY d.queue_id, d.consumer_group),
    cursors AS (
        SELECT lc.queue_id, lc.consumer_group, count(*) AS partitions,
               sum(lp.next_offset - lc.cursor_offset)::bigint AS lag,
               count(*) FILTER (WHERE lc.lease_id IS NOT NULL AND lc.lease_expires_at > (SELECT now FROM clock))
                   AS leased,
               min((SELECT ls.created_at FROM queen.log_segments ls
                     WHERE ls.partition_id = lc.partition_id AND ls.base_offset <= lc.cursor_offset
                     ORDER BY ls.base_offset DESC LIMIT 1))
                   FILTER (WHERE lc.cursor_offset < lp.next_offset) AS oldest_pending_at
          FROM page JOIN queen.log_consumers lc ON lc.queue_id = page.id
          JOIN queen.log_partitions lp ON lp.id = lc.partition_id
         GROUP BY lc.queue_id, lc.consumer_group)
    SELECT page.tenant, page.name, NULL::text, coalesce(p.partitions, 0), coalesce(p.messages, 0), NULL::bigint,
           NULL::double precision, NULL::bigint,
           coalesce((SELECT sum(d.n) FROM dead d WHERE d.queue_id = page.id), 0)::bigint
      FROM page
      LEFT JOIN LATERAL (SELECT count(*) AS partitions, sum(lp.next_offset)::bigint AS messages
                           FROM queen.log_partitions lp WHERE lp.queue_id = page.id) p ON true
    UNION ALL
    SELECT page.tenant, page.name, g.name, coalesce(c.partitions, 0), NULL::bigint, coalesce(c.lag, 0),
           coalesce(greatest(extract(epoch FROM (SELECT now FROM clock) - c.oldest_pending_at), 0), 0)::double precision,
           coalesce(c.leased, 0), coalesce(d.n, 0)
      FROM page
      JOIN queen.log_groups g ON g.queue_id = page.id
      LEFT JOIN cursors c ON c.queue_id = g.queue_id AND c.consumer_group = g.name
      LEFT JOIN dead d ON d.queue_id = g.queue_id AND d.consumer_group = g.name
$$;
