-- Traces: events a consumer records about a message (POST /api/v1/traces, the client's
-- message["trace"]({...})), read back per message, per name, and the names in use; and their retention.
--
-- A trace names its message by (partitionId, transactionId) as the client has them; the message need
-- not be retained any more, but the partition must exist (traces go with it when its queue is
-- deleted). Timestamps via queen._iso_utc; partition ids as strings; queue mode shows as
-- "consumerGroup": null.
--
-- queen.trace_add_v1(tenant, partition_id, transaction_id, group, names[], event_type, data text, now)
--   -> jsonb. Called by POST /api/v1/traces. Stores one event (data = JSON text; JSON that jsonb
--   refuses, e.g. a \u0000 escape, is kept as a JSON string of its text) and one trace_names row per
--   distinct name. Result {"status":"recorded","id","createdAt"} or {"status":"no_partition"}.
--   Locks: none beyond the inserted rows (and KEY SHARE on the partition row through the foreign key).
-- queen.traces_for_message_v2(tenant, partition_id, transaction_id, limit, offset, max_bytes) -> jsonb
--   Called by GET /api/v1/traces/{partitionId}/{transactionId}: the message's timeline, oldest first:
--   {"partitionId","transactionId","queue","partition","traces":[{"id","consumerGroup","queueMode",
--   "eventType","traceNames","data","createdAt"}],"total","limit","offset"} or {"notFound":"partition"}.
-- queen.traces_by_name_v2(tenant, name, from, to, limit, offset, max_bytes) -> jsonb
--   Called by GET /api/v1/traces/by-name/{name}: newest first, created in [from, to) (NULL = open):
--   {"traceName","traces":[{... as above, "partitionId","queue","partition","transactionId"}],
--   "total","limit","offset"}. Cost: a range scan of trace_names' primary key.
--   Both pages stop at the answer budget (queen_pg/engine/answers.py): a trace is shown only while the
--   JSON text of the traces before it is under max_bytes (the first always; NULL = no limit). Each row
--   of the page is measured (its data's text, one row at a time); only the rows within the budget are
--   built into the answer.
-- queen.trace_names_v1(tenant, search, limit, offset) -> jsonb
--   Called by GET /api/v1/traces/names: {"names":[{"name","count","lastSeen"}],"total","limit",
--   "offset"}, by name; search = case-insensitive substring. Cost: a scan of trace_names' primary key
--   for the tenant (bounded by the trace retention).
-- queen.traces_retention_v1(limit, keep_seconds, now) -> integer
--   Called by the trace_retention job (queen_pg/jobs/traces.py): deletes up to `limit` of the oldest
--   traces created before now - keep_seconds (their trace_names rows go by cascade); keep_seconds <= 0
--   deletes nothing. Result: traces deleted (0 also when another replica holds TRACES_RETENTION_LOCK).
--   Locks (docs/architecture.md#lock-order): TRACES_RETENTION_LOCK (try); the deleted rows.
-- The reads take no locks.

CREATE OR REPLACE FUNCTION queen.trace_add_v1(
    p_tenant text, p_partition_id bigint, p_txn text, p_group text, p_names text[], p_event text, p_data text,
    p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := coalesce(p_now, clock_timestamp());
    v_data jsonb;
    v_id   bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM queen.log_partitions p WHERE p.id = p_partition_id AND p.tenant = p_tenant) THEN
        RETURN jsonb_build_object('status', 'no_partition');
    END IF;
    BEGIN
        v_data := p_data::jsonb;
    EXCEPTION WHEN data_exception THEN
        v_data := to_jsonb(p_data);
    END;
    INSERT INTO queen.traces (tenant, partition_id, transaction_id, consumer_group, event_type, trace_names,
                              data, created_at)
    VALUES (p_tenant, p_partition_id, p_txn, p_group, p_event,
            coalesce(ARRAY(SELECT DISTINCT n FROM unnest(p_names) AS n ORDER BY n), '{}'), v_data, v_now)
    RETURNING id INTO v_id;
    INSERT INTO queen.trace_names (tenant, name, created_at, trace_id)
    SELECT DISTINCT p_tenant, n, v_now, v_id FROM unnest(p_names) AS n;
    RETURN jsonb_build_object('status', 'recorded', 'id', v_id, 'createdAt', queen._iso_utc(v_now));
END;
$$;

CREATE OR REPLACE FUNCTION queen._trace_doc(t queen.traces)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', t.id, 'consumerGroup', queen._group_out(t.consumer_group),
        'queueMode', queen._queue_mode(t.consumer_group), 'eventType', t.event_type,
        'traceNames', to_jsonb(t.trace_names), 'data', t.data, 'createdAt', queen._iso_utc(t.created_at))
$$;

CREATE OR REPLACE FUNCTION queen.traces_for_message_v2(
    p_tenant text, p_partition_id bigint, p_txn text, p_limit integer, p_offset integer, p_max_bytes bigint)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    WITH p AS (
        SELECT lp.id, lp.name, q.name AS queue
          FROM queen.log_partitions lp JOIN queen.queues q ON q.id = lp.queue_id
         WHERE lp.id = p_partition_id AND lp.tenant = p_tenant
    ), m AS (
        SELECT t FROM queen.traces t WHERE t.partition_id = p_partition_id AND t.transaction_id = p_txn
    ), page AS (
        SELECT (m.t).id AS id, (m.t).created_at AS created_at, m.t
          FROM m ORDER BY (m.t).created_at, (m.t).id
         LIMIT greatest(p_limit, 0) OFFSET greatest(p_offset, 0)
    ), sized AS (
        SELECT page.*, coalesce(sum(octet_length((page.t).data::text) + 256)
                                    OVER (ORDER BY page.created_at, page.id
                                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS bytes_before
          FROM page
    )
    SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM p) THEN jsonb_build_object('notFound', 'partition') ELSE
           jsonb_build_object(
               'partitionId', p_partition_id::text, 'transactionId', p_txn,
               'queue', (SELECT p.queue FROM p), 'partition', (SELECT p.name FROM p),
               'total', (SELECT count(*) FROM m), 'limit', p_limit, 'offset', p_offset,
               'traces', coalesce((SELECT jsonb_agg(queen._trace_doc(sized.t) ORDER BY sized.created_at, sized.id)
                                     FROM sized
                                    WHERE p_max_bytes IS NULL OR sized.bytes_before < p_max_bytes),
                                  '[]'::jsonb)) END
$$;

CREATE OR REPLACE FUNCTION queen.traces_by_name_v2(
    p_tenant text, p_name text, p_from timestamptz, p_to timestamptz, p_limit integer, p_offset integer,
    p_max_bytes bigint)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    WITH m AS (
        SELECT n.trace_id, n.created_at FROM queen.trace_names n
         WHERE n.tenant = p_tenant AND n.name = p_name
           AND (p_from IS NULL OR n.created_at >= p_from) AND (p_to IS NULL OR n.created_at < p_to)
    ), page AS (
        SELECT m.* FROM m ORDER BY m.created_at DESC, m.trace_id DESC
         LIMIT greatest(p_limit, 0) OFFSET greatest(p_offset, 0)
    ), sized AS (
        SELECT page.created_at, page.trace_id, t, lp.name AS pname, q.name AS qname,
               coalesce(sum(octet_length(t.data::text) + 256)
                            OVER (ORDER BY page.created_at DESC, page.trace_id DESC
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS bytes_before
          FROM page
          JOIN queen.traces t ON t.id = page.trace_id
          JOIN queen.log_partitions lp ON lp.id = t.partition_id
          JOIN queen.queues q ON q.id = lp.queue_id
    )
    SELECT jsonb_build_object(
        'traceName', p_name, 'total', (SELECT count(*) FROM m), 'limit', p_limit, 'offset', p_offset,
        'traces', coalesce((
            SELECT jsonb_agg(queen._trace_doc(sized.t) || jsonb_build_object(
                       'partitionId', (sized.t).partition_id::text, 'transactionId', (sized.t).transaction_id,
                       'queue', sized.qname, 'partition', sized.pname)
                   ORDER BY sized.created_at DESC, sized.trace_id DESC)
              FROM sized
             WHERE p_max_bytes IS NULL OR sized.bytes_before < p_max_bytes), '[]'::jsonb))
$$;

CREATE OR REPLACE FUNCTION queen.trace_names_v1(p_tenant text, p_search text, p_limit integer, p_offset integer)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    WITH m AS (
        SELECT n.name, count(*) AS n, max(n.created_at) AS last_seen
          FROM queen.trace_names n
         WHERE n.tenant = p_tenant AND (p_search IS NULL OR strpos(lower(n.name), lower(p_search)) > 0)
         GROUP BY n.name
    ), page AS (
        SELECT m.* FROM m ORDER BY m.name LIMIT greatest(p_limit, 0) OFFSET greatest(p_offset, 0)
    )
    SELECT jsonb_build_object(
        'total', (SELECT count(*) FROM m), 'limit', p_limit, 'offset', p_offset,
        'names', coalesce((SELECT jsonb_agg(jsonb_build_object('name', page.name, 'count', page.n,
                                                               'lastSeen', queen._iso_utc(page.last_seen))
                                            ORDER BY page.name) FROM page), '[]'::jsonb))
$$;

CREATE OR REPLACE FUNCTION queen.traces_retention_v1(
    p_limit integer, p_keep_seconds integer, p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_n   integer;
BEGIN
    IF p_keep_seconds <= 0 OR NOT pg_try_advisory_xact_lock(7781200171) THEN  -- TRACES_RETENTION_LOCK
        RETURN 0;
    END IF;
    DELETE FROM queen.traces t
     WHERE t.id IN (SELECT o.id FROM queen.traces o
                     WHERE o.created_at < v_now - make_interval(secs => p_keep_seconds)
                     ORDER BY o.created_at LIMIT greatest(p_limit, 1));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;
