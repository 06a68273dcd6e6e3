-- Metrics: what GET /metrics reads from the database, in one call per scrape.
--
-- queen.metrics_queues_v1(p_tenant, p_limit, p_offset, p_now) -> rows
--   Called by: GET /metrics/queues (queen_pg/api/status/metrics.py), one page of queues, by (tenant,
--   name): tenant NULL = every tenant's. GET /metrics itself reads the per-tenant snapshot
--   (queen.metrics_tenants_v1, sql/procedures/098_stats_snapshot.sql).
--   Result: one row per queue with consumer_group NULL: partitions, messages (every offset ever
--   given: sum of next_offset), dlq (dead letters of the queue); and one row per (queue, consumer
--   group), queue mode as '__QUEUE_MODE__': partitions (cursor rows), lag (messages not yet done:
--   next_offset - cursor_offset summed over the group's partitions), lag_seconds (age at p_now of the
--   oldest message not yet done; 0 when lag is 0), leased_partitions (live leases at p_now), dlq (the
--   group's dead letters). messages is NULL on group rows; lag, lag_seconds and leased_partitions
--   are NULL on queue rows.
--   Cost: the page's queues only (their partitions, groups, cursor rows, dead letters by queue_id
--   index; one primary-key probe into log_segments per lagging cursor row, for lag_seconds).
--   Locks: none (plain reads under MVCC); see docs/architecture.md#lock-order.

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
