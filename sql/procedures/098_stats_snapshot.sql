-- Status snapshot: the per-tenant figures of GET /api/v1/status, /api/v1/resources/overview and the
-- aggregated series of GET /metrics, kept in queen.tenant_stats (sql/schema.sql) by the stats_snapshot
-- job, so that those reads cost one primary-key probe at any number of queues (a scan per call cost
-- 0.2 ms per queue: 1 s at 5,000 queues). Terms (messages, retained, backlog, inFlight, lag) as in
-- sql/procedures/100_resources.sql.
--
-- queen._tenant_figures(tenant, now) -> one row (queues, partitions, messages, retained, backlog,
--   in_flight, dlq, consumer_groups, namespaces, tasks, group_lag, lag_seconds, leased_partitions, acked)
--   Internal: the figures of one tenant, computed set-based from its queues (joined by queue_id to
--   their partitions, cursor rows, groups and dead letters: index probes for a small tenant, hash joins
--   for a large one; one primary-key probe into log_segments
--   per partition for its first retained offset and per lagging cursor row for its oldest pending
--   message). backlog = sum over queues of (largest group lag; retained messages with no group);
--   group_lag = sum of every group's lag; lag_seconds = age at `now` of the oldest message some group
--   has not done (0: none). Reads only, no locks.
-- queen.stats_snapshot_v1(limit, min_gap_seconds, now, tenant DEFAULT NULL) -> integer
--   Called by: the stats_snapshot job (queen_pg/jobs/stats.py) every few seconds, and POST
--   /api/v1/stats/refresh with the caller's tenant (min_gap 0). Recomputes the row of up to `limit`
--   tenants (only `tenant` when given) whose row is older than min_gap_seconds (tenants without a row
--   first, then the oldest), stamped as_of = now, with the tenant's queen.group_lag rows (every (queue,
--   group) pair with a pending message: cursor rows, behind, lag, oldest = min(head_at)), and deletes
--   the rows of tenants that have no queue left. Result: tenants refreshed; 0 when another replica holds STATS_SNAPSHOT_LOCK (job call).
--   Locks (docs/architecture.md#lock-order): STATS_SNAPSHOT_LOCK (try for the job; waited for with a tenant: the clock
--   is read after it), then only tenant_stats and group_lag rows;
--   the counted rows are read without locks (MVCC): a push or ack committing meanwhile shows in the
--   next snapshot. No push, pop or ack ever writes tenant_stats.
-- queen.tenant_overview_v1(tenant, now) -> record
--   Internal to resources_overview_v1 and metrics_tenants_v1: the tenant's tenant_stats row, or (no
--   snapshot yet: a new tenant, or before the job's first tick) the figures computed live with
--   as_of = now.
-- queen.metrics_tenants_v1() -> rows (tenant, + the tenant_stats columns)
--   Called by: GET /metrics (queen_pg/metrics.py), at most once a second per process: every tenant's
--   row. Cost: one row per tenant. Reads only.

CREATE OR REPLACE FUNCTION queen._tenant_figures(p_tenant text, p_now timestamptz)
RETURNS TABLE (queues bigint, partitions bigint, messages bigint, retained bigint, backlog bigint,
               in_flight bigint, dlq bigint, consumer_groups bigint, namespaces bigint, tasks bigint,
               group_lag bigint, lag_seconds double precision, leased_partitions bigint, acked bigint)
LANGUAGE sql STABLE AS $$
    WITH q AS (
        SELECT q.id, q.namespace, q.task FROM queen.queues q WHERE q.tenant = p_tenant
    ), parts AS (
        SELECT p.queue_id, count(*) AS partitions, sum(p.next_offset) AS messages,
               sum(p.next_offset - coalesce((SELECT s.base_offset FROM queen.log_segments s
                                              WHERE s.partition_id = p.id ORDER BY s.base_offset LIMIT 1),
                                            p.next_offset)) AS retained
          FROM q JOIN queen.log_partitions p ON p.queue_id = q.id
         GROUP BY p.queue_id
    ), cur AS (
        SELECT lc.queue_id, lc.consumer_group,
               sum(p.next_offset - lc.cursor_offset) AS lag,
               sum(CASE WHEN lc.lease_id IS NOT NULL AND lc.lease_expires_at > p_now
                        THEN greatest(lc.lease_end - lc.cursor_offset, 0) ELSE 0 END) AS in_flight,
               count(*) FILTER (WHERE lc.lease_id IS NOT NULL AND lc.lease_expires_at > p_now) AS leased,
               min((SELECT s.created_at FROM queen.log_segments s
                     WHERE s.partition_id = lc.partition_id AND s.base_offset <= lc.cursor_offset
                     ORDER BY s.base_offset DESC LIMIT 1))
                   FILTER (WHERE lc.cursor_offset < p.next_offset) AS oldest,
               sum(lc.acked_total) AS acked
          FROM q JOIN queen.log_consumers lc ON lc.queue_id = q.id
          JOIN queen.log_partitions p ON p.id = lc.partition_id
         GROUP BY lc.queue_id, lc.consumer_group
    ), grp AS (
        SELECT g.queue_id, count(*) AS groups, max(coalesce(cur.lag, 0)) AS max_lag,
               sum(coalesce(cur.lag, 0)) AS lag, sum(coalesce(cur.in_flight, 0)) AS in_flight,
               sum(coalesce(cur.leased, 0)) AS leased, min(cur.oldest) AS oldest,
               sum(coalesce(cur.acked, 0)) AS acked
          FROM q JOIN queen.log_groups g ON g.queue_id = q.id
          LEFT JOIN cur ON cur.queue_id = g.queue_id AND cur.consumer_group = g.name
         GROUP BY g.queue_id
    ), dead AS (
        SELECT d.queue_id, count(*) AS n FROM q JOIN queen.log_dlq d ON d.queue_id = q.id GROUP BY d.queue_id
    )
    SELECT count(*), coalesce(sum(parts.partitions), 0)::bigint, coalesce(sum(parts.messages), 0)::bigint,
           coalesce(sum(parts.retained), 0)::bigint,
           coalesce(sum(coalesce(grp.max_lag, parts.retained, 0)), 0)::bigint,
           coalesce(sum(grp.in_flight), 0)::bigint, coalesce(sum(dead.n), 0)::bigint,
           coalesce(sum(grp.groups), 0)::bigint, count(DISTINCT q.namespace), count(DISTINCT q.task),
           coalesce(sum(grp.lag), 0)::bigint,
           coalesce(greatest(extract(epoch FROM p_now - min(grp.oldest)), 0), 0)::double precision,
           coalesce(sum(grp.leased), 0)::bigint, coalesce(sum(grp.acked), 0)::bigint
      FROM q
      LEFT JOIN parts ON parts.queue_id = q.id
      LEFT JOIN grp ON grp.queue_id = q.id
      LEFT JOIN dead ON dead.queue_id = q.id
$$;

CREATE OR REPLACE FUNCTION queen.stats_snapshot_v1(
    p_limit integer, p_min_gap_seconds integer, p_now timestamptz DEFAULT NULL, p_tenant text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz;
    v_tenant text;
    v_start  timestamptz;
    v_n      integer := 0;
BEGIN
    IF p_tenant IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(7781200172);  -- STATS_SNAPSHOT_LOCK: wait for a tick in progress
    ELSIF NOT pg_try_advisory_xact_lock(7781200172) THEN  -- STATS_SNAPSHOT_LOCK
        RETURN 0;
    END IF;
    v_now := coalesce(p_now, clock_timestamp());
    FOR v_tenant IN
        SELECT t.tenant
          FROM (SELECT DISTINCT q.tenant FROM queen.queues q
                 WHERE p_tenant IS NULL OR q.tenant = p_tenant) t
          LEFT JOIN queen.tenant_stats s ON s.tenant = t.tenant
         WHERE s.as_of IS NULL OR s.as_of <= v_now - make_interval(secs => p_min_gap_seconds)
         ORDER BY s.as_of NULLS FIRST, t.tenant
         LIMIT greatest(p_limit, 1)
    LOOP
        v_start := clock_timestamp();
        INSERT INTO queen.tenant_stats AS s
               (tenant, queues, partitions, messages, retained, backlog, in_flight, dlq, consumer_groups,
                namespaces, tasks, group_lag, lag_seconds, leased_partitions, acked, as_of, took_ms)
        SELECT v_tenant, f.queues, f.partitions, f.messages, f.retained, f.backlog, f.in_flight, f.dlq,
               f.consumer_groups, f.namespaces, f.tasks, f.group_lag, f.lag_seconds, f.leased_partitions,
               f.acked, v_now, extract(epoch FROM clock_timestamp() - v_start) * 1000
          FROM queen._tenant_figures(v_tenant, v_now) f
        ON CONFLICT ON CONSTRAINT tenant_stats_pkey DO UPDATE
           SET queues = excluded.queues, partitions = excluded.partitions, messages = excluded.messages,
               retained = excluded.retained, backlog = excluded.backlog, in_flight = excluded.in_flight,
               dlq = excluded.dlq, consumer_groups = excluded.consumer_groups,
               namespaces = excluded.namespaces, tasks = excluded.tasks, group_lag = excluded.group_lag,
               lag_seconds = excluded.lag_seconds, leased_partitions = excluded.leased_partitions,
               acked = excluded.acked, as_of = excluded.as_of, took_ms = excluded.took_ms;
        -- the tenant's lagging (queue, group) pairs (GET /api/v1/consumer-groups/lagging): the oldest
        -- pending message of a cursor row is its maintained head_at (no segment probe). Only rows that
        -- changed are written (a steady world writes none: no dead rows, the reads stay index-only).
        WITH c AS (
            SELECT x.queue_id, x.consumer_group, q.name AS queue, x.partitions, x.behind, x.lag, x.oldest
              FROM (SELECT lc.queue_id, lc.consumer_group, count(*) AS partitions,
                           count(*) FILTER (WHERE lc.cursor_offset < p.next_offset) AS behind,
                           sum(greatest(p.next_offset - lc.cursor_offset, 0))::bigint AS lag,
                           min(lc.head_at) FILTER (WHERE lc.cursor_offset < p.next_offset) AS oldest
                      FROM queen.log_consumers lc JOIN queen.log_partitions p ON p.id = lc.partition_id
                     WHERE lc.tenant = v_tenant
                     GROUP BY lc.queue_id, lc.consumer_group) AS x
              JOIN queen.queues q ON q.id = x.queue_id
             WHERE x.oldest IS NOT NULL
        ), gone AS (
            DELETE FROM queen.group_lag g
             WHERE g.tenant = v_tenant
               AND NOT EXISTS (SELECT 1 FROM c WHERE c.queue_id = g.queue_id AND c.consumer_group = g.consumer_group)
        )
        INSERT INTO queen.group_lag AS g (tenant, queue_id, consumer_group, queue, partitions, behind, lag, oldest)
        SELECT v_tenant, c.queue_id, c.consumer_group, c.queue, c.partitions, c.behind, c.lag, c.oldest
          FROM c
         WHERE NOT EXISTS (  -- not even a row lock on an unchanged row: it would clear its all-visible bit
               SELECT 1 FROM queen.group_lag o
                WHERE o.tenant = v_tenant AND o.queue_id = c.queue_id AND o.consumer_group = c.consumer_group
                  AND (o.queue, o.partitions, o.behind, o.lag, o.oldest)
                      IS NOT DISTINCT FROM (c.queue, c.partitions, c.behind, c.lag, c.oldest))
         ORDER BY c.queue_id, c.consumer_group
        ON CONFLICT ON CONSTRAINT group_lag_pkey DO UPDATE
           SET queue = excluded.queue, partitions = excluded.partitions, behind = excluded.behind,
               lag = excluded.lag, oldest = excluded.oldest;
        v_n := v_n + 1;
    END LOOP;
    DELETE FROM queen.tenant_stats s
     WHERE NOT EXISTS (SELECT 1 FROM queen.queues q WHERE q.tenant = s.tenant);
    -- (group_lag rows go with their queue: ON DELETE CASCADE)
    RETURN v_n;
END;
$$;

CREATE OR REPLACE FUNCTION queen.tenant_overview_v1(p_tenant text, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (queues bigint, partitions bigint, messages bigint, retained bigint, backlog bigint,
               in_flight bigint, dlq bigint, consumer_groups bigint, namespaces bigint, tasks bigint,
               group_lag bigint, lag_seconds double precision, leased_partitions bigint, acked bigint,
               as_of timestamptz)
LANGUAGE plpgsql STABLE AS $$
-- plpgsql, not sql: the live query is planned only when it runs (a sql function re-plans every
-- branch at every call, which cost more than the snapshot read at 100,000 queues).
BEGIN
    RETURN QUERY
        SELECT s.queues, s.partitions, s.messages, s.retained, s.backlog, s.in_flight, s.dlq, s.consumer_groups,
               s.namespaces, s.tasks, s.group_lag, s.lag_seconds, s.leased_partitions, s.acked, s.as_of
          FROM queen.tenant_stats s WHERE s.tenant = p_tenant;
    IF NOT FOUND THEN
        RETURN QUERY SELECT f.*, coalesce(p_now, now())
                       FROM queen._tenant_figures(p_tenant, coalesce(p_now, now())) f;
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION queen.metrics_tenants_v1()
RETURNS TABLE (tenant text, queues bigint, partitions bigint, messages bigint, retained bigint, backlog bigint,
               in_flight bigint, dlq bigint, consumer_groups bigint, group_lag bigint,
               lag_seconds double precision, leased_partitions bigint, acked bigint, as_of timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT s.tenant, s.queues, s.partitions, s.messages, s.retained, s.backlog, s.in_flight, s.dlq,
           s.consumer_groups, s.group_lag, s.lag_seconds, s.leased_partitions, s.acked, s.as_of
      FROM queen.tenant_stats s ORDER BY s.tenant
$$;
