-- Consumer-group administration: list, inspect, delete, seek, re-subscribe (docs/wire.md#admin).
--
-- Conventions shared by every procedure here:
--   * Results are jsonb built for the HTTP answer. Timestamps are ISO-8601 UTC with microseconds
--     ("2026-01-01T00:00:00.123456Z", queen._iso_utc); partition ids are strings, as in pop answers.
--   * Queue mode is the group '__QUEUE_MODE__'; it is shown as "name": null, "queueMode": true
--     (queen._group_out, queen._queue_mode: 001_internal.sql).
--   * Lag of a (partition, group) = next_offset - cursor_offset (an ack is an offset commit,
--     docs/wire.md#ack-offset-commit; offsets the group passes over, queen.log_passes, count until the cursor passes them).
--     `ackedAhead` is always [] since the offset-commit ack (kept for readers of the old shape). A lease is live when lease_id is set
--     and lease_expires_at > coalesce(p_now, now()) (the reads, STABLE) or clock_timestamp() (the writes).
--   * An unknown queue, group or partition is a result, not an exception:
--     {"notFound": "queue"|"group"|"partition"} (get: NULL), which queen_pg/engine/groups.py turns
--     into 404 not_found. No procedure here raises for bad input: the broker validates it first.
--
-- queen.consumer_groups_list_v1(tenant, limit, offset, now) -> jsonb
--   Called by: GET /api/v1/consumer-groups. One entry per (queue, group) of the tenant, ordered by
--   group name then queue name, paginated: {"consumerGroups": [{"name","queueMode","queue",
--   "namespace","task","partitions","totalLag","leasedPartitions","subscriptionMode",
--   "subscriptionFrom","createdAt"}], "total","limit","offset"}.
--   Locks: none (a read). Cost: one index scan of log_consumers per listed entry.
--
-- queen.consumer_group_get_v1(tenant, group, now) -> jsonb | NULL
--   Called by: GET /api/v1/consumer-groups/{group}. The group on every queue that has it:
--   {"name","queueMode","totalLag","queues": [{"queue","namespace","task","subscriptionMode",
--   "subscriptionFrom","createdAt","partitionCount","totalLag","leasedPartitions","partitions":
--   [{"partition","partitionId","cursor","nextOffset","lag","ackedAhead","leaseId","leaseExpiresAt",
--   "leaseEnd","leaseLive","deliveryAttempts","ackedTotal","lastWriteAt"}]}]}. NULL = no such group.
--   Locks: none (a read).
--
-- queen.consumer_group_delete_v1(tenant, group, queue, delete_metadata, now) -> jsonb
--   Called by: DELETE /api/v1/consumer-groups/{group}/queues/{queue} (queue given) and
--   DELETE /api/v1/consumer-groups/{group} (queue NULL = every queue that has the group).
--   Deletes the group's cursor rows on those queues; live leases on them are broken.
--   delete_metadata = true: the log_groups row goes too; the next pop creates the group anew with the
--     subscription that pop asks for (default: from the first retained message).
--   delete_metadata = false: the log_groups row (subscription mode and subscribed_from) is kept and
--     the cursors are recreated at once from it, as queen._create_group would: from the first message
--     written at or after subscribed_from, or from the first retained message when it is NULL. (pop_v1
--     only creates cursors for a group it does not know, so keeping the row without cursors would
--     leave the group stuck.) acked_total and the retry budget start from zero.
--   Result: {"success":true,"group","queueMode","deleteMetadata","cursorsDeleted","leasesBroken",
--   "queues":[{"queue","cursorsDeleted","leasesBroken","groupDeleted","cursorsRecreated",
--   "resumeFrom"}]} or {"notFound":"queue"|"group"}.
--   Locks: (docs/architecture.md#lock-order) queues FOR UPDATE ascending id (#1: no partition or group is created on
--   those queues meanwhile), then log_consumers FOR UPDATE ascending (partition_id, group) (#3), then
--   the log_groups rows (deleted; only queen.consumer_group_subscription_v1 locks them otherwise).
--
-- queen.consumer_group_seek_v1(tenant, group, queue, partition, target, ts, now) -> jsonb
--   Called by: POST /api/v1/consumer-groups/{group}/queues/{queue}/seek and
--   .../partitions/{partition}/seek (partition NULL = every partition of the queue).
--   target 'end': cursor = next_offset. 'start': cursor = first retained offset (min base_offset of
--   the partition's segments; next_offset when none). 'timestamp': cursor = base_offset of the first
--   segment with created_at >= ts (next_offset when none), never below the first retained offset.
--   Since created_at rises with base_offset, replaying from ts re-delivers exactly the retained
--   messages written at or after ts. Every moved row is reset: lease and released lease
--   cleared (a live lease is broken: its holder's acks are refused from now on), delivered_end = the
--   new cursor, attempts 0, retry budget (fail_offset, failures) cleared. acked_total is kept.
--   Result: {"success":true,"group","queueMode","queue","partition","target","timestamp",
--   "leasesBroken","partitions":[{"partition","partitionId","oldCursor","newCursor","lag",
--   "leaseBroken"}]} or {"notFound":"queue"|"group"|"partition"}.
--   Locks: log_consumers FOR UPDATE ascending (partition_id, group) (docs/architecture.md#lock-order #3). The partition
--   rows are not locked: a push committing meanwhile lands either before the new cursor or after it.
--   Cost: 'timestamp' scans the partition's segment index up to the first match.
--
-- queen.consumer_group_subscription_v1(tenant, group, from) -> jsonb
--   Called by: POST /api/v1/consumer-groups/{group}/subscription. Sets subscribed_from = from and
--   subscription_mode = 'from' on every queue that has the group. Cursors do NOT move (seek does that);
--   the stored rule is what DELETE ...?deleteMetadata=false recreates the cursors from. Partitions
--   created later still start at their offset 0 (queen._create_partitions).
--   Result: {"success":true,"group","queueMode","subscriptionFrom","queues":[names],
--   "cursorsMoved":false} or {"notFound":"group"}.
--   Locks: the group's log_groups rows FOR UPDATE ascending queue_id (no other lock is held with them).

CREATE OR REPLACE FUNCTION queen._iso_utc(p_ts timestamptz)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT to_char(p_ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;

-- The head of the answer of an operation on a group (delete, seek, subscription): success, the
-- group's name (NULL for queue mode) and queueMode.
CREATE OR REPLACE FUNCTION queen._group_done(p_group text)
RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('success', true, 'group', queen._group_out(p_group),
                              'queueMode', queen._queue_mode(p_group))
$$;

CREATE OR REPLACE FUNCTION queen.consumer_groups_list_v1(
    p_tenant text, p_limit integer, p_offset integer, p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    WITH g AS (
        SELECT g.queue_id, g.name, g.subscription_mode, g.subscribed_from, g.created_at,
               q.name AS queue, q.namespace, q.task
          FROM queen.log_groups g
          JOIN queen.queues q ON q.id = g.queue_id
         WHERE q.tenant = p_tenant
    ), page AS (
        SELECT g.*, row_number() OVER (ORDER BY g.name, g.queue) AS ord
          FROM g
         ORDER BY g.name, g.queue
         LIMIT greatest(p_limit, 0) OFFSET greatest(p_offset, 0)
    )
    SELECT jsonb_build_object(
        'total', (SELECT count(*) FROM g),
        'limit', p_limit,
        'offset', p_offset,
        'consumerGroups', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                       'name', queen._group_out(page.name),
                       'queueMode', queen._queue_mode(page.name),
                       'queue', page.queue, 'namespace', page.namespace, 'task', page.task,
                       'partitions', s.partitions, 'totalLag', s.lag, 'leasedPartitions', s.leased,
                       'subscriptionMode', page.subscription_mode,
                       'subscriptionFrom', queen._iso_utc(page.subscribed_from),
                       'createdAt', queen._iso_utc(page.created_at)) ORDER BY page.ord)
              FROM page
             CROSS JOIN LATERAL (
                   SELECT count(*) AS partitions,
                          coalesce(sum(p.next_offset - lc.cursor_offset), 0) AS lag,
                          count(*) FILTER (WHERE lc.lease_id IS NOT NULL
                                             AND lc.lease_expires_at > coalesce(p_now, now())) AS leased
                     FROM queen.log_consumers lc
                     JOIN queen.log_partitions p ON p.id = lc.partition_id
                    WHERE lc.queue_id = page.queue_id AND lc.consumer_group = page.name) s
        ), '[]'::jsonb))
$$;

CREATE OR REPLACE FUNCTION queen.consumer_group_get_v1(p_tenant text, p_group text, p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    WITH g AS (
        SELECT g.queue_id, g.subscription_mode, g.subscribed_from, g.created_at,
               q.name AS queue, q.namespace, q.task
          FROM queen.log_groups g
          JOIN queen.queues q ON q.id = g.queue_id
         WHERE q.tenant = p_tenant AND g.name = p_group
    ), parts AS (
        SELECT lc.queue_id, p.name, p.next_offset - lc.cursor_offset AS lag,
               (lc.lease_id IS NOT NULL AND lc.lease_expires_at > coalesce(p_now, now())) AS live,
               jsonb_build_object(
                   'partition', p.name, 'partitionId', lc.partition_id::text,
                   'cursor', lc.cursor_offset, 'nextOffset', p.next_offset,
                   'lag', p.next_offset - lc.cursor_offset, 'ackedAhead', '[]'::jsonb,
                   'leaseId', lc.lease_id, 'leaseExpiresAt', queen._iso_utc(lc.lease_expires_at),
                   'leaseEnd', lc.lease_end,
                   'leaseLive', lc.lease_id IS NOT NULL
                                AND lc.lease_expires_at > coalesce(p_now, now()),
                   'deliveryAttempts', lc.attempts, 'ackedTotal', lc.acked_total,
                   'lastWriteAt', queen._iso_utc(p.last_write_at)) AS doc
          FROM queen.log_consumers lc
          JOIN queen.log_partitions p ON p.id = lc.partition_id
         WHERE lc.queue_id IN (SELECT g.queue_id FROM g) AND lc.consumer_group = p_group
    ), per_queue AS (
        SELECT g.queue, coalesce(sum(parts.lag), 0) AS lag,
               jsonb_build_object(
                   'queue', g.queue, 'namespace', g.namespace, 'task', g.task,
                   'subscriptionMode', g.subscription_mode,
                   'subscriptionFrom', queen._iso_utc(g.subscribed_from),
                   'createdAt', queen._iso_utc(g.created_at),
                   'partitionCount', count(parts.doc),
                   'totalLag', coalesce(sum(parts.lag), 0),
                   'leasedPartitions', count(*) FILTER (WHERE parts.live),
                   'partitions', coalesce(jsonb_agg(parts.doc ORDER BY parts.name)
                                          FILTER (WHERE parts.doc IS NOT NULL), '[]'::jsonb)) AS doc
          FROM g
          LEFT JOIN parts ON parts.queue_id = g.queue_id
         GROUP BY g.queue_id, g.queue, g.namespace, g.task, g.subscription_mode, g.subscribed_from, g.created_at
    )
    SELECT CASE WHEN count(*) = 0 THEN NULL ELSE
           jsonb_build_object(
               'name', queen._group_out(p_group),
               'queueMode', queen._queue_mode(p_group),
               'totalLag', sum(per_queue.lag),
               'queues', jsonb_agg(per_queue.doc ORDER BY per_queue.queue)) END
      FROM per_queue
$$;

CREATE OR REPLACE FUNCTION queen.consumer_group_delete_v1(
    p_tenant text, p_group text, p_queue text, p_delete_metadata boolean, p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_qids    bigint[];
    v_stats   jsonb;     -- queue id -> [cursors deleted, live leases broken]
    v_cursors bigint;
    v_broken  bigint;
    v_queues  jsonb;
BEGIN
    IF p_queue IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM queen.queues q WHERE q.tenant = p_tenant AND q.name = p_queue) THEN
        RETURN jsonb_build_object('notFound', 'queue');
    END IF;

    -- 1. the queues that have the group (docs/architecture.md#lock-order #1)
    SELECT array_agg(l.id ORDER BY l.id) INTO v_qids
      FROM (SELECT q.id FROM queen.queues q
             WHERE q.tenant = p_tenant AND (p_queue IS NULL OR q.name = p_queue)
               AND EXISTS (SELECT 1 FROM queen.log_groups g WHERE g.queue_id = q.id AND g.name = p_group)
             ORDER BY q.id
               FOR UPDATE OF q) AS l;
    -- re-read under the locks: a concurrent delete may have removed the group while we waited
    SELECT array_agg(g.queue_id ORDER BY g.queue_id) INTO v_qids
      FROM queen.log_groups g WHERE g.queue_id = ANY (v_qids) AND g.name = p_group;
    IF v_qids IS NULL THEN
        RETURN jsonb_build_object('notFound', 'group');
    END IF;

    -- 2. the group's cursor rows (docs/architecture.md#lock-order #3)
    PERFORM 1 FROM queen.log_consumers lc
     WHERE lc.queue_id = ANY (v_qids) AND lc.consumer_group = p_group
     ORDER BY lc.partition_id, lc.consumer_group
       FOR UPDATE;

    SELECT jsonb_object_agg(s.queue_id::text, jsonb_build_array(s.cursors, s.broken)),
           coalesce(sum(s.cursors), 0), coalesce(sum(s.broken), 0)
      INTO v_stats, v_cursors, v_broken
      FROM (SELECT lc.queue_id, count(*) AS cursors,
                   count(*) FILTER (WHERE lc.lease_id IS NOT NULL AND lc.lease_expires_at > v_now) AS broken
              FROM queen.log_consumers lc
             WHERE lc.queue_id = ANY (v_qids) AND lc.consumer_group = p_group
             GROUP BY lc.queue_id) AS s;

    DELETE FROM queen.log_consumers lc WHERE lc.queue_id = ANY (v_qids) AND lc.consumer_group = p_group;

    IF p_delete_metadata THEN
        DELETE FROM queen.log_groups g WHERE g.queue_id = ANY (v_qids) AND g.name = p_group;
    ELSE
        -- recreate the cursors from the kept subscription rule (as queen._create_group does)
        INSERT INTO queen.log_consumers (partition_id, consumer_group, queue_id, tenant, cursor_offset,
                                         delivered_end)
        SELECT p.id, p_group, p.queue_id, p_tenant, c.start_at, c.start_at
          FROM queen.log_partitions p
          JOIN queen.log_groups g ON g.queue_id = p.queue_id AND g.name = p_group
         CROSS JOIN LATERAL (
               SELECT coalesce((SELECT min(s.base_offset) FROM queen.log_segments s
                                 WHERE s.partition_id = p.id
                                   AND (g.subscribed_from IS NULL OR s.created_at >= g.subscribed_from)),
                               p.next_offset) AS start_at) c
         WHERE p.queue_id = ANY (v_qids)
         ORDER BY p.id;
    END IF;

    SELECT jsonb_agg(jsonb_build_object(
               'queue', q.name,
               'cursorsDeleted', coalesce((v_stats -> q.id::text ->> 0)::bigint, 0),
               'leasesBroken', coalesce((v_stats -> q.id::text ->> 1)::bigint, 0),
               'groupDeleted', p_delete_metadata,
               'cursorsRecreated', (SELECT count(*) FROM queen.log_consumers lc
                                     WHERE lc.queue_id = q.id AND lc.consumer_group = p_group),
               'resumeFrom', queen._iso_utc(g.subscribed_from)) ORDER BY q.name)
      INTO v_queues
      FROM queen.queues q
      LEFT JOIN queen.log_groups g ON g.queue_id = q.id AND g.name = p_group
     WHERE q.id = ANY (v_qids);

    RETURN queen._group_done(p_group) || jsonb_build_object(
        'deleteMetadata', p_delete_metadata,
        'cursorsDeleted', v_cursors,
        'leasesBroken', v_broken,
        'queues', v_queues);
END;
$$;

CREATE OR REPLACE FUNCTION queen.consumer_group_seek_v1(
    p_tenant text, p_group text, p_queue text, p_partition text, p_target text, p_ts timestamptz,
    p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := coalesce(p_now, clock_timestamp());
    v_qid    bigint;
    v_pid    bigint;
    v_rows   jsonb;
BEGIN
    SELECT q.id INTO v_qid FROM queen.queues q WHERE q.tenant = p_tenant AND q.name = p_queue;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('notFound', 'queue');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM queen.log_groups g WHERE g.queue_id = v_qid AND g.name = p_group) THEN
        RETURN jsonb_build_object('notFound', 'group');
    END IF;
    IF p_partition IS NOT NULL THEN
        SELECT p.id INTO v_pid FROM queen.log_partitions p WHERE p.queue_id = v_qid AND p.name = p_partition;
        IF NOT FOUND THEN
            RETURN jsonb_build_object('notFound', 'partition');
        END IF;
    END IF;

    -- the cursor rows, ascending (docs/architecture.md#lock-order #3)
    PERFORM 1 FROM queen.log_consumers lc
     WHERE lc.queue_id = v_qid AND lc.consumer_group = p_group AND (v_pid IS NULL OR lc.partition_id = v_pid)
     ORDER BY lc.partition_id, lc.consumer_group
       FOR UPDATE;

    WITH t AS (
        SELECT lc.partition_id, p.name, p.next_offset, lc.cursor_offset AS old_cursor,
               (lc.lease_id IS NOT NULL AND lc.lease_expires_at > v_now) AS broken,
               CASE p_target
                   WHEN 'end' THEN p.next_offset
                   WHEN 'start' THEN f.first_retained
                   ELSE greatest(f.first_retained,
                                 coalesce((SELECT min(s.base_offset) FROM queen.log_segments s
                                            WHERE s.partition_id = p.id AND s.created_at >= p_ts),
                                          p.next_offset))
               END AS new_cursor
          FROM queen.log_consumers lc
          JOIN queen.log_partitions p ON p.id = lc.partition_id
         CROSS JOIN LATERAL (
               SELECT coalesce(min(s.base_offset), p.next_offset) AS first_retained
                 FROM queen.log_segments s WHERE s.partition_id = p.id) f
         WHERE lc.queue_id = v_qid AND lc.consumer_group = p_group AND (v_pid IS NULL OR lc.partition_id = v_pid)
    ), moved AS (
        UPDATE queen.log_consumers lc
           SET cursor_offset = t.new_cursor,
               lease_id = NULL, lease_expires_at = NULL, lease_end = NULL, released_lease_id = NULL,
               delivered_end = t.new_cursor, attempts = 0, fail_offset = NULL, failures = 0
          FROM t
         WHERE lc.partition_id = t.partition_id AND lc.consumer_group = p_group
        RETURNING t.*
    )
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'partition', m.name, 'partitionId', m.partition_id::text,
               'oldCursor', m.old_cursor, 'newCursor', m.new_cursor, 'lag', m.next_offset - m.new_cursor,
               'leaseBroken', m.broken) ORDER BY m.name), '[]'::jsonb)
      INTO v_rows
      FROM moved m;

    RETURN queen._group_done(p_group) || jsonb_build_object(
        'queue', p_queue,
        'partition', p_partition,
        'target', p_target,
        'timestamp', queen._iso_utc(p_ts),
        'leasesBroken', (SELECT count(*) FROM jsonb_array_elements(v_rows) e WHERE (e ->> 'leaseBroken')::boolean),
        'partitions', v_rows);
END;
$$;

CREATE OR REPLACE FUNCTION queen.consumer_group_subscription_v1(p_tenant text, p_group text, p_from timestamptz)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_queues jsonb;
BEGIN
    PERFORM 1 FROM queen.log_groups g
      JOIN queen.queues q ON q.id = g.queue_id
     WHERE q.tenant = p_tenant AND g.name = p_group
     ORDER BY g.queue_id
       FOR UPDATE OF g;

    WITH upd AS (
        UPDATE queen.log_groups g
           SET subscribed_from = p_from, subscription_mode = 'from'
          FROM queen.queues q
         WHERE q.id = g.queue_id AND q.tenant = p_tenant AND g.name = p_group
        RETURNING q.name
    )
    SELECT jsonb_agg(upd.name ORDER BY upd.name) INTO v_queues FROM upd;
    IF v_queues IS NULL THEN
        RETURN jsonb_build_object('notFound', 'group');
    END IF;
    RETURN queen._group_done(p_group) || jsonb_build_object(
        'subscriptionFrom', queen._iso_utc(p_from),
        'queues', v_queues,
        'cursorsMoved', false);
END;
$$;
