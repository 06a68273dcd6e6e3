-- Resources: what queues, partitions, namespaces and tasks hold (docs/wire.md#admin, the admin family).
--
-- Conventions shared by every procedure here:
--   * Reads only: no locks (plain MVCC reads, docs/architecture.md#lock-order), no writes; STABLE. Results are jsonb built
--     for the HTTP answer; timestamps via queen._iso_utc; partition ids as strings.
--   * messages = every offset ever given (sum of next_offset). retained = messages still stored
--     (next_offset - first retained offset). Lag of a (partition, group) = next_offset - cursor_offset.
--     backlog of a queue or partition = the largest lag of any of its groups (queue mode included); with
--     no group yet, its retained messages (what a first consumer would receive).
--   * inFlight = messages under a live lease (lease_expires_at > p_now) not yet acked:
--     lease_end - cursor_offset, summed (offsets the group passes over inside the lease still count).
--   * Queue mode is the group '__QUEUE_MODE__', shown as "name": null, "queueMode": true
--     (queen._group_out, queen._queue_mode: 001_internal.sql).
--   * An unknown queue or group is a result: {"notFound": "queue"|"group"} (detail: NULL), turned into
--     404 not_found by queen_pg/engine/admin.py. Inputs are validated by the broker first.
--   * p_now: NULL = now(). Cost (but the overview's, a snapshot read): these reads visit every partition and cursor row of the queues they
--     report (one primary-key probe into log_segments per partition for its first retained offset and,
--     for the per-group lagSeconds of a queue's detail, per lagging cursor); lists are paged.
--
-- queen._queue_summary(queue_id, now) -> jsonb {"partitions","messages","retained","backlog",
--   "inFlight","dlq","groups":[{"name","queueMode","lag"}]}. Internal to the procedures below.
-- queen._queue_entry(queue_id, name, namespace, task, created_at, now) -> jsonb: a queue's entry in a
--   list, {"name","namespace","task","createdAt", +the summary} (resources_queues_v1, status_queues_v1).
-- queen.resources_overview_v1(tenant, now) -> jsonb: counts over the tenant: queues, partitions,
--   messages, retained, backlog (sum of the queues' backlogs), inFlight, dlq, consumerGroups
--   ((queue, group) pairs), namespaces, tasks, timestamp (now), asOf (when the counts were computed)
--   and ageSeconds (now - asOf). Called by GET /api/v1/resources/overview and /status. The counts
--   are the tenant's queen.tenant_stats row (sql/procedures/098_stats_snapshot.sql: one primary-key
--   probe, refreshed every few seconds by the stats_snapshot job), computed live only while the tenant
--   has no row yet.
-- queen.resources_queues_v1(tenant, search, namespace, task, limit, offset, now) -> jsonb
--   Called by GET /api/v1/resources/queues. {"queues":[{"name","namespace","task","createdAt", +the
--   summary}],"total","limit","offset"}, by name; search = case-insensitive substring of the name.
-- queen.resources_queue_v1(tenant, queue, limit, offset, now) -> jsonb | NULL
--   Called by GET /api/v1/resources/queues/{queue}. The summary, "config", "groups" with subscription,
--   leasedPartitions, oldestPendingAt and lagSeconds, and one page of "partitions" (by name) with each
--   group's cursor, lag and lease; "partitionsTotal".
-- queen.resources_queue_depth_v1(tenant, queue, group, limit, offset) -> jsonb
--   Called by GET /api/v1/resources/queues/{queue}/depth. {"queue","group","pending",
--   "partitionsPending","conflation":false,"effectivePending","partitions":[{"partition","pending"}],
--   "partitionsTotal","limit","offset"}; pending per partition = the group's lag (group given), else
--   the partition's backlog.
-- queen.resources_partitions_v1(tenant, queue, limit, offset, now) -> jsonb
--   Called by GET /api/v1/resources/partitions. {"partitions":[{"id","name","queue","messages",
--   "retained","backlog","inFlight","groups","lastWriteAt","createdAt"}],"total","limit","offset"},
--   by queue then partition name; queue NULL = every queue of the tenant.
-- queen.resources_tags_v1(tenant, kind 'namespace'|'task', limit, offset, now) -> jsonb
--   Called by GET /api/v1/resources/namespaces and /tasks: {"namespaces"|"tasks":[{"namespace"|"task",
--   "queues","partitions","messages","backlog","dlq"}],"total","limit","offset"}.

CREATE OR REPLACE FUNCTION queen._queue_summary(p_queue_id bigint, p_now timestamptz)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    WITH parts AS (
        SELECT p.next_offset,
               p.next_offset - coalesce((SELECT s.base_offset FROM queen.log_segments s
                                          WHERE s.partition_id = p.id ORDER BY s.base_offset LIMIT 1),
                                        p.next_offset) AS retained
          FROM queen.log_partitions p WHERE p.queue_id = p_queue_id
    ), cons AS (
        SELECT lc.consumer_group, p.next_offset - lc.cursor_offset AS lag,
               CASE WHEN lc.lease_id IS NOT NULL AND lc.lease_expires_at > p_now
                    THEN greatest(lc.lease_end - lc.cursor_offset, 0)
                    ELSE 0 END AS in_flight
          FROM queen.log_consumers lc JOIN queen.log_partitions p ON p.id = lc.partition_id
         WHERE lc.queue_id = p_queue_id
    ), grp AS (
        SELECT g.name, coalesce(sum(cons.lag), 0) AS lag
          FROM queen.log_groups g LEFT JOIN cons ON cons.consumer_group = g.name
         WHERE g.queue_id = p_queue_id
         GROUP BY g.name
    )
    SELECT jsonb_build_object(
        'partitions', (SELECT count(*) FROM parts),
        'messages', (SELECT coalesce(sum(parts.next_offset), 0) FROM parts),
        'retained', (SELECT coalesce(sum(parts.retained), 0) FROM parts),
        'backlog', coalesce((SELECT max(grp.lag) FROM grp), (SELECT coalesce(sum(parts.retained), 0) FROM parts)),
        'inFlight', (SELECT coalesce(sum(cons.in_flight), 0) FROM cons),
        'dlq', (SELECT count(*) FROM queen.log_dlq d WHERE d.queue_id = p_queue_id),
        'groups', coalesce((SELECT jsonb_agg(jsonb_build_object(
                                'name', queen._group_out(grp.name),
                                'queueMode', queen._queue_mode(grp.name),
                                'lag', grp.lag) ORDER BY grp.name) FROM grp), '[]'::jsonb))
$$;

CREATE OR REPLACE FUNCTION queen._queue_entry(
    p_queue_id bigint, p_name text, p_namespace text, p_task text, p_created_at timestamptz, p_now timestamptz)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('name', p_name, 'namespace', p_namespace, 'task', p_task,
                              'createdAt', queen._iso_utc(p_created_at))
           || queen._queue_summary(p_queue_id, p_now)
$$;

CREATE OR REPLACE FUNCTION queen.resources_overview_v1(p_tenant text, p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'queues', o.queues, 'partitions', o.partitions, 'messages', o.messages, 'retained', o.retained,
        'backlog', o.backlog, 'inFlight', o.in_flight, 'dlq', o.dlq, 'consumerGroups', o.consumer_groups,
        'namespaces', o.namespaces, 'tasks', o.tasks,
        'timestamp', queen._iso_utc(coalesce(p_now, now())),
        'asOf', queen._iso_utc(o.as_of),
        'ageSeconds', round(greatest(extract(epoch FROM coalesce(p_now, now()) - o.as_of), 0)::numeric, 3))
      FROM queen.tenant_overview_v1(p_tenant, p_now) o
$$;

CREATE OR REPLACE FUNCTION queen.resources_queues_v1(
    p_tenant text, p_search text, p_namespace text, p_task text, p_limit integer, p_offset integer,
    p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    WITH m AS (
        SELECT q.id, q.name, q.namespace, q.task, q.created_at
          FROM queen.queues q
         WHERE q.tenant = p_tenant
           AND (p_search IS NULL OR strpos(lower(q.name), lower(p_search)) > 0)
           AND (p_namespace IS NULL OR q.namespace = p_namespace)
           AND (p_task IS NULL OR q.task = p_task)
    ), page AS (
        SELECT m.* FROM m ORDER BY m.name LIMIT greatest(p_limit, 0) OFFSET greatest(p_offset, 0)
    )
    SELECT jsonb_build_object(
        'total', (SELECT count(*) FROM m), 'limit', p_limit, 'offset', p_offset,
        'queues', coalesce((
            SELECT jsonb_agg(queen._queue_entry(page.id, page.name, page.namespace, page.task, page.created_at,
                                                coalesce(p_now, now())) ORDER BY page.name)
              FROM page), '[]'::jsonb))
$$;

CREATE OR REPLACE FUNCTION queen.resources_queue_v1(
    p_tenant text, p_queue text, p_limit integer, p_offset integer, p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    WITH q AS (
        SELECT q.* FROM queen.queues q WHERE q.tenant = p_tenant AND q.name = p_queue
    ), cons AS (
        SELECT lc.*, p.name AS pname, p.next_offset,
               lc.lease_id IS NOT NULL AND lc.lease_expires_at > coalesce(p_now, now()) AS live,
               CASE WHEN lc.cursor_offset < p.next_offset THEN
                    (SELECT s.created_at FROM queen.log_segments s
                      WHERE s.partition_id = lc.partition_id AND s.base_offset <= lc.cursor_offset
                      ORDER BY s.base_offset DESC LIMIT 1) END AS pending_at  -- (lc.* has head_at: schema.sql)
          FROM queen.log_consumers lc
          JOIN queen.log_partitions p ON p.id = lc.partition_id
         WHERE lc.queue_id = (SELECT q.id FROM q)
    ), groups AS (
        SELECT g.name, jsonb_build_object(
                   'name', queen._group_out(g.name), 'queueMode', queen._queue_mode(g.name),
                   'subscriptionMode', g.subscription_mode,
                   'subscriptionFrom', queen._iso_utc(g.subscribed_from),
                   'createdAt', queen._iso_utc(g.created_at),
                   'lag', coalesce(sum(cons.next_offset - cons.cursor_offset), 0),
                   'leasedPartitions', count(*) FILTER (WHERE cons.live),
                   'oldestPendingAt', queen._iso_utc(min(cons.pending_at)),
                   'lagSeconds', extract(epoch FROM coalesce(p_now, now()) - min(cons.pending_at))) AS doc
          FROM queen.log_groups g
          LEFT JOIN cons ON cons.consumer_group = g.name
         WHERE g.queue_id = (SELECT q.id FROM q)
         GROUP BY g.name, g.subscription_mode, g.subscribed_from, g.created_at
    ), page AS (
        SELECT p.* FROM queen.log_partitions p
         WHERE p.queue_id = (SELECT q.id FROM q)
         ORDER BY p.name LIMIT greatest(p_limit, 0) OFFSET greatest(p_offset, 0)
    ), parts AS (
        SELECT page.name, jsonb_build_object(
                   'id', page.id::text, 'name', page.name, 'nextOffset', page.next_offset,
                   'firstOffset', f.first_offset, 'retained', page.next_offset - f.first_offset,
                   'lastWriteAt', queen._iso_utc(page.last_write_at),
                   'createdAt', queen._iso_utc(page.created_at),
                   'groups', coalesce((
                       SELECT jsonb_agg(jsonb_build_object(
                                  'name', queen._group_out(c.consumer_group),
                                  'queueMode', queen._queue_mode(c.consumer_group),
                                  'cursor', c.cursor_offset, 'lag', c.next_offset - c.cursor_offset,
                                  'leased', c.live,
                                  'leaseExpiresAt', CASE WHEN c.live THEN queen._iso_utc(c.lease_expires_at) END,
                                  'oldestPendingAt', queen._iso_utc(c.pending_at)) ORDER BY c.consumer_group)
                         FROM cons c WHERE c.partition_id = page.id), '[]'::jsonb)) AS doc
          FROM page
         CROSS JOIN LATERAL (
               SELECT coalesce((SELECT s.base_offset FROM queen.log_segments s WHERE s.partition_id = page.id
                                 ORDER BY s.base_offset LIMIT 1), page.next_offset) AS first_offset) f
    )
    SELECT (queen._queue_summary(q.id, coalesce(p_now, now())) - 'partitions' - 'groups')
           || jsonb_build_object(
               'name', q.name, 'namespace', q.namespace, 'task', q.task,
               'createdAt', queen._iso_utc(q.created_at), 'updatedAt', queen._iso_utc(q.updated_at),
               'config', jsonb_build_object(
                   'leaseTime', q.lease_time, 'retryLimit', q.retry_limit, 'priority', q.priority,
                   'delayedProcessing', q.delayed_processing, 'windowBuffer', q.window_buffer,
                   'maxSize', q.max_size, 'retentionSeconds', q.retention_seconds,
                   'completedRetentionSeconds', q.completed_retention_seconds,
                   'dedupWindowSeconds', q.dedup_window_seconds, 'encryptionEnabled', q.encryption_enabled,
                   'options', q.options),
               'groups', coalesce((SELECT jsonb_agg(groups.doc ORDER BY groups.name) FROM groups), '[]'::jsonb),
               'partitionsTotal', (SELECT count(*) FROM queen.log_partitions p WHERE p.queue_id = q.id),
               'limit', p_limit, 'offset', p_offset,
               'partitions', coalesce((SELECT jsonb_agg(parts.doc ORDER BY parts.name) FROM parts), '[]'::jsonb))
      FROM q
$$;

CREATE OR REPLACE FUNCTION queen.resources_queue_depth_v1(
    p_tenant text, p_queue text, p_group text, p_limit integer, p_offset integer)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_qid    bigint;
    v_groups boolean;
BEGIN
    SELECT q.id INTO v_qid FROM queen.queues q WHERE q.tenant = p_tenant AND q.name = p_queue;
    IF v_qid IS NULL THEN
        RETURN jsonb_build_object('notFound', 'queue');
    END IF;
    IF p_group IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM queen.log_groups g WHERE g.queue_id = v_qid AND g.name = p_group) THEN
        RETURN jsonb_build_object('notFound', 'group');
    END IF;
    v_groups := EXISTS (SELECT 1 FROM queen.log_groups g WHERE g.queue_id = v_qid);
    RETURN (
        WITH d AS (
            SELECT p.name,
                   CASE WHEN p_group IS NOT NULL OR v_groups THEN
                        coalesce((SELECT max(p.next_offset - lc.cursor_offset) FROM queen.log_consumers lc
                                   WHERE lc.partition_id = p.id
                                     AND (p_group IS NULL OR lc.consumer_group = p_group)), 0)
                   ELSE p.next_offset - coalesce((SELECT s.base_offset FROM queen.log_segments s
                                                   WHERE s.partition_id = p.id
                                                   ORDER BY s.base_offset LIMIT 1), p.next_offset)
                   END AS pending
              FROM queen.log_partitions p WHERE p.queue_id = v_qid
        )
        SELECT jsonb_build_object(
            'queue', p_queue, 'group', p_group,
            'pending', coalesce(sum(d.pending), 0),
            'partitionsPending', count(*) FILTER (WHERE d.pending > 0),
            'conflation', false,
            'effectivePending', coalesce(sum(d.pending), 0),
            'partitionsTotal', count(*), 'limit', p_limit, 'offset', p_offset,
            'partitions', coalesce((SELECT jsonb_agg(jsonb_build_object('partition', x.name, 'pending', x.pending)
                                                     ORDER BY x.name)
                                      FROM (SELECT d2.* FROM d d2 ORDER BY d2.name
                                             LIMIT greatest(p_limit, 0) OFFSET greatest(p_offset, 0)) x),
                                   '[]'::jsonb))
          FROM d);
END;
$$;

CREATE OR REPLACE FUNCTION queen.resources_partitions_v1(
    p_tenant text, p_queue text, p_limit integer, p_offset integer, p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, now());
BEGIN
    IF p_queue IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM queen.queues q WHERE q.tenant = p_tenant AND q.name = p_queue) THEN
        RETURN jsonb_build_object('notFound', 'queue');
    END IF;
    RETURN (
        WITH m AS (
            SELECT p.id, p.name, p.next_offset, p.last_write_at, p.created_at, q.name AS queue
              FROM queen.log_partitions p JOIN queen.queues q ON q.id = p.queue_id
             WHERE q.tenant = p_tenant AND (p_queue IS NULL OR q.name = p_queue)
        ), page AS (
            SELECT m.* FROM m ORDER BY m.queue, m.name LIMIT greatest(p_limit, 0) OFFSET greatest(p_offset, 0)
        ), rows AS (
            SELECT page.queue, page.name, jsonb_build_object(
                       'id', page.id::text, 'name', page.name, 'queue', page.queue,
                       'messages', page.next_offset, 'retained', page.next_offset - f.first_offset,
                       'backlog', coalesce(c.max_lag, page.next_offset - f.first_offset),
                       'inFlight', coalesce(c.in_flight, 0), 'groups', coalesce(c.groups, 0),
                       'lastWriteAt', queen._iso_utc(page.last_write_at),
                       'createdAt', queen._iso_utc(page.created_at)) AS doc
              FROM page
             CROSS JOIN LATERAL (
                   SELECT coalesce((SELECT s.base_offset FROM queen.log_segments s WHERE s.partition_id = page.id
                                     ORDER BY s.base_offset LIMIT 1), page.next_offset) AS first_offset) f
             CROSS JOIN LATERAL (
                   SELECT max(page.next_offset - lc.cursor_offset) AS max_lag, count(*) AS groups,
                          sum(CASE WHEN lc.lease_id IS NOT NULL AND lc.lease_expires_at > v_now
                                   THEN greatest(lc.lease_end - lc.cursor_offset, 0)
                                   ELSE 0 END) AS in_flight
                     FROM queen.log_consumers lc WHERE lc.partition_id = page.id) c
        )
        SELECT jsonb_build_object(
            'total', (SELECT count(*) FROM m), 'limit', p_limit, 'offset', p_offset,
            'partitions', coalesce((SELECT jsonb_agg(rows.doc ORDER BY rows.queue, rows.name) FROM rows), '[]'::jsonb)));
END;
$$;

CREATE OR REPLACE FUNCTION queen.resources_tags_v1(
    p_tenant text, p_kind text, p_limit integer, p_offset integer, p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    WITH m AS (
        SELECT CASE WHEN p_kind = 'task' THEN q.task ELSE q.namespace END AS tag, q.id
          FROM queen.queues q
         WHERE q.tenant = p_tenant AND (CASE WHEN p_kind = 'task' THEN q.task ELSE q.namespace END) IS NOT NULL
    ), tags AS (
        SELECT DISTINCT m.tag FROM m
    ), page AS (
        SELECT tags.tag FROM tags ORDER BY tags.tag LIMIT greatest(p_limit, 0) OFFSET greatest(p_offset, 0)
    ), rows AS (
        SELECT page.tag, jsonb_build_object(
                   CASE WHEN p_kind = 'task' THEN 'task' ELSE 'namespace' END, page.tag,
                   'queues', count(*),
                   'partitions', sum((s.doc ->> 'partitions')::bigint),
                   'messages', sum((s.doc ->> 'messages')::bigint),
                   'backlog', sum((s.doc ->> 'backlog')::bigint),
                   'dlq', sum((s.doc ->> 'dlq')::bigint)) AS doc
          FROM page
          JOIN m ON m.tag = page.tag
         CROSS JOIN LATERAL (SELECT queen._queue_summary(m.id, coalesce(p_now, now())) AS doc) s
         GROUP BY page.tag
    )
    SELECT jsonb_build_object(
        'total', (SELECT count(*) FROM tags), 'limit', p_limit, 'offset', p_offset,
        CASE WHEN p_kind = 'task' THEN 'tasks' ELSE 'namespaces' END,
        coalesce((SELECT jsonb_agg(rows.doc ORDER BY rows.tag) FROM rows), '[]'::jsonb))
$$;
