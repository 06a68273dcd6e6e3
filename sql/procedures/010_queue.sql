-- Queue management: configure (create or update) and delete.
--
-- queen.configure_queue_v2(tenant, queue, namespace, task, options jsonb, may_weaken boolean, now) -> jsonb
--   Called by: POST /api/v1/configure. Creates the queue when missing, then applies the given
--   options (camelCase keys of docs/wire.md#configure; validated by the broker before the call; keys it does
--   not know are kept in `options`). Result: the queue as {"id","name","namespace","task","options"}.
--   Locks: the queue row (INSERT ... ON CONFLICT DO UPDATE), docs/architecture.md#lock-order #1. Turning
--   encryptionEnabled on also takes the queue's partition rows FOR NO KEY UPDATE, ascending id (#2):
--   it waits for the pushes in flight, and every push that locks a partition after this commits
--   reads encryption_enabled = true under that lock (queen.push_v1 refuses plaintext then).
--   Weakening: unless `may_weaken` (the caller has the admin level, or JWT is off), options that weaken
--   a guarantee of a queue that existed before this call are refused, decided under the queue row lock
--   against the stored values: encryptionEnabled from true to false (payloads at rest stop being
--   sealed) and a dedupWindowSeconds below the stored one (duplicates pushed outside the shorter window
--   are taken). A queue this call creates has nothing to weaken.
--   Errors: queen._refuse('forbidden', ...) (403) naming every weakening option; nothing is written.
--
-- queen.configure_queue_v1(tenant, queue, namespace, task, options jsonb, now) -> jsonb
--   The previous release's call (its brokers, during a rolling deploy): configure_queue_v2 with
--   may_weaken, as that release decided. Dropped the release after (000_dropped.sql).
--
-- queen.delete_queue_v1(tenant, queue) -> boolean
--   Called by: DELETE /api/v1/resources/queues/{queue}. Deletes the queue and, by cascade, its
--   partitions, segments, hashes, groups, cursors and dead letters, and its timers. Result: whether it
--   existed.
--   Locks: the queue row FOR UPDATE (#1), then its partition rows ascending id (#2), then its cursor
--   rows ascending (partition_id, group) (#3), each before the cascade deletes them; then the other
--   child rows (cascade).

CREATE OR REPLACE FUNCTION queen.configure_queue_v2(
    p_tenant text, p_queue text, p_namespace text, p_task text, p_options jsonb, p_may_weaken boolean,
    p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now   timestamptz := coalesce(p_now, now());
    o       jsonb := coalesce(p_options, '{}'::jsonb);
    q       queen.queues%ROWTYPE;
    v_id    bigint;
    v_new   boolean;
    v_was   boolean;
    v_weak  text[] := '{}';
BEGIN
    INSERT INTO queen.queues AS t (tenant, name, namespace, task, created_at, updated_at)
    VALUES (p_tenant, p_queue, p_namespace, p_task, v_now, v_now)
    ON CONFLICT ON CONSTRAINT queues_tenant_name_key DO UPDATE
       SET namespace = coalesce(excluded.namespace, t.namespace),
           task = coalesce(excluded.task, t.task),
           updated_at = v_now
    RETURNING t.id, (t.xmax = 0) INTO v_id, v_new;  -- xmax 0: inserted; an upsert's update locks it
    SELECT * INTO q FROM queen.queues t WHERE t.id = v_id;  -- the stored options, under our row lock
    v_was := q.encryption_enabled;

    IF NOT p_may_weaken AND NOT v_new THEN
        IF q.encryption_enabled AND NOT coalesce((o ->> 'encryptionEnabled')::boolean, true) THEN
            v_weak := v_weak || 'options.encryptionEnabled false turns encryption off (it is on)'::text;
        END IF;
        IF (o ->> 'dedupWindowSeconds')::integer < q.dedup_window_seconds THEN
            v_weak := v_weak || format('options.dedupWindowSeconds %s shortens the dedup window (it is %s)',
                                       o ->> 'dedupWindowSeconds', q.dedup_window_seconds);
        END IF;
        IF cardinality(v_weak) > 0 THEN
            PERFORM queen._refuse('forbidden', format(
                'queue %s: %s; weakening a queue needs the admin level', p_queue, array_to_string(v_weak, '; ')));
        END IF;
    END IF;

    UPDATE queen.queues t SET
        lease_time = coalesce((o ->> 'leaseTime')::integer, t.lease_time),
        retry_limit = coalesce((o ->> 'retryLimit')::integer, t.retry_limit),
        priority = coalesce((o ->> 'priority')::integer, t.priority),
        delayed_processing = coalesce((o ->> 'delayedProcessing')::integer, t.delayed_processing),
        window_buffer = coalesce((o ->> 'windowBuffer')::integer, t.window_buffer),
        max_size = coalesce((o ->> 'maxSize')::integer, t.max_size),
        retention_seconds = coalesce((o ->> 'retentionSeconds')::integer, t.retention_seconds),
        completed_retention_seconds =
            coalesce((o ->> 'completedRetentionSeconds')::integer, t.completed_retention_seconds),
        dedup_window_seconds = coalesce((o ->> 'dedupWindowSeconds')::integer, t.dedup_window_seconds),
        encryption_enabled = coalesce((o ->> 'encryptionEnabled')::boolean, t.encryption_enabled),
        options = t.options || o
     WHERE t.id = q.id
    RETURNING * INTO q;
    IF q.encryption_enabled AND NOT v_was THEN
        PERFORM 1 FROM queen.log_partitions lp WHERE lp.queue_id = q.id ORDER BY lp.id FOR NO KEY UPDATE;
    END IF;

    RETURN jsonb_build_object(
        'id', q.id, 'name', q.name, 'namespace', q.namespace, 'task', q.task,
        'createdAt', q.created_at,
        'options', jsonb_build_object(
            'leaseTime', q.lease_time, 'retryLimit', q.retry_limit, 'priority', q.priority,
            'delayedProcessing', q.delayed_processing, 'windowBuffer', q.window_buffer,
            'maxSize', q.max_size, 'retentionSeconds', q.retention_seconds,
            'completedRetentionSeconds', q.completed_retention_seconds,
            'dedupWindowSeconds', q.dedup_window_seconds, 'encryptionEnabled', q.encryption_enabled));
END;
$$;

CREATE OR REPLACE FUNCTION queen.configure_queue_v1(
    p_tenant text, p_queue text, p_namespace text, p_task text, p_options jsonb,
    p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql AS $$
    SELECT queen.configure_queue_v2(p_tenant, p_queue, p_namespace, p_task, p_options, true, p_now);
$$;

CREATE OR REPLACE FUNCTION queen.delete_queue_v1(p_tenant text, p_queue text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_qid bigint;
BEGIN
    SELECT q.id INTO v_qid FROM queen.queues q WHERE q.tenant = p_tenant AND q.name = p_queue FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- What the cascade deletes, locked first in the order every writer takes it (docs/architecture.md#lock-order):
    -- partitions ascending (level 2), then cursor rows ascending (partition_id, group) (level 3), as
    -- push_v1 and ack_v1 do. The cascade alone deletes in its indexes' order (log_consumers by
    -- head_at), which could take an ack's cursor rows out of order: a deadlock
    -- (tests/test_lock_order.py::test_ack_to_dlq_racing_queue_delete).
    PERFORM 1 FROM queen.log_partitions lp WHERE lp.queue_id = v_qid ORDER BY lp.id FOR UPDATE;
    PERFORM 1 FROM queen.log_consumers lc WHERE lc.queue_id = v_qid
     ORDER BY lc.partition_id, lc.consumer_group FOR UPDATE;
    -- log_txns has no foreign key (sql/schema.sql, revision 0009): its rows go here, under the
    -- partition rows locked above (every writer of log_txns holds its partition row).
    DELETE FROM queen.log_txns t USING queen.log_partitions lp WHERE lp.queue_id = v_qid AND t.partition_id = lp.id;
    DELETE FROM queen.queues WHERE id = v_qid;
    -- log_dlq has no foreign keys (docs/architecture.md#lock-order): its rows go here, in a statement that starts after
    -- the cascade above waited for every ack holding a cursor row of the queue, so it sees their rows.
    DELETE FROM queen.log_dlq WHERE queue_id = v_qid;
    DELETE FROM queen.timers WHERE tenant = p_tenant AND queue = p_queue;  -- a pending timer would recreate it
    RETURN true;
END;
$$;
