-- Timers (docs/wire.md#timers): schedule, cancel, read, and fire messages scheduled into a queue.
--
-- A timer is one row of queen.timers per (tenant, queue, timer_key); it exists from schedule until its
-- fire commits (docs/wire.md#timers-no-tombstone). Firing pushes it with queen.push_v1 (transactionId = txn, id = message_id,
-- data = payload, a raw QPF1 frame, codec 0) and deletes the row in the same transaction: no tombstone.
-- So after a fire a peek answers found:false, a cancel answers absent, and a schedule of the same key
-- is a new timer (`scheduled`). `too_late` is only for a cancel that meets a fire in progress.
--
-- Key locks (docs/architecture.md#lock-order, level 0b): TIMER_KEY_CLASS = 77813, pg_advisory_xact_lock(77813,
-- queen._timer_hash(tenant, queue, timer_key)), one per key, ascending hash order, after the KV keys
-- and before any row is touched.
--   * Writers (POST /timers, the transaction's rider, via queen._timer_lock) take them EXCLUSIVE and wait.
--   * The firing job takes them SHARED with a try-lock: it never waits, it skips a key a writer holds.
--   * DELETE /timers (queen.timer_cancel_v1) tries EXCLUSIVE; when that fails it tries SHARED. Shared
--     is granted only when every holder is shared, i.e. the firing job: a due timer is then being fired
--     and the answer is too_late at once. Refused means a writer holds the key: the cancel waits for it
--     and decides on what the writer left. So a cancel racing the fire either cancels (the fire finds no
--     row and pushes nothing), answers too_late (the fire is in progress: the message is pushed), or,
--     once the fire committed, absent (the message was pushed); never a cancel and a push both.
-- Timer rows are locked only under their key lock (FOR UPDATE by writers, FOR UPDATE SKIP LOCKED by the
-- fire), so they need no place of their own in the row-lock order.
--
-- queen._timer_hash(tenant, queue, timer_key) -> integer: the second half of the key lock.
--
-- queen._timer_lock(tenant, queues[], keys[]) -> void
--   Takes the exclusive key lock of every distinct (queue, key) pair, ascending hash order. Callers:
--   queen.timers_v1, queen.transaction_v1 (after queen._kv_lock).
--
-- queen._timer_apply(tenant, op jsonb, payload bytea, txn_hash uuid, message_id uuid, now) -> jsonb
--   Applies ONE op validated by the broker (queen_pg/api/timers/ops.py); the caller holds the key lock.
--   op = {"op": "schedule"|"reschedule", "queue", "timerKey", "partition", "delayMs", "txn", "producerSub"?}:
--     upsert; deliver_at = now + delayMs (negative = already due: fired by the job's next cycle). Status
--     `rescheduled` when a pending timer was replaced, else `scheduled` (a new key, including a key
--     whose timer already fired: the fire deleted it).
--     The message id is p_message_id, except that a resend of the pending schedule (same txn) keeps the
--     id it promised the first time. producerSub is the scheduling token's sub, added by the broker
--     (queen_pg/engine/timers.py ops_text; a client's is refused as server-owned): kept in
--     timers.producer_sub (the last schedule's), it is the fired message's producerSub (frame flag 2).
--     Result {ok: true, status, queue, timerKey, txn, messageId, deliverAt, partition}.
--     p_payload is sealed (a leading NUL byte) exactly when the queue is encrypted, else
--     queen._refuse('encryption_mismatch', {queue: encrypted}) (nothing written; the broker learns it and
--     calls again). Not locked against a concurrent configure: a schedule racing the switch to
--     encryption may stay plain, like a message pushed just before it.
--   op = {"op": "cancel", "queue", "timerKey", "txn"?}: a pending timer (with that txn, when given) is
--     deleted: {ok: true, status: cancelled, txn}. No such pending timer (never scheduled, cancelled, or
--     already fired): {ok: false, status: absent, txn: <the given txn>}. Results also carry queue and
--     timerKey. p_payload, p_txn_hash, p_message_id unused.
--
-- queen.timers_v1(tenant, ops jsonb, payloads bytea[], hashes uuid[], msgids uuid[], now) -> jsonb
--   Called by: POST /api/v1/timers (queen_pg/engine/timers.py). Arrays are index-aligned with ops.
--   Locks every key of the batch (queen._timer_lock), then applies the ops in order.
--   Result {"results": [one queen._timer_apply result per op]}.
--
-- queen.timer_cancel_v1(tenant, queue, timer_key, txn, now) -> jsonb
--   Called by: DELETE /api/v1/timers/{queue}/{timerKey...}. The cancel result above; the key lock as
--   described at the top (too_late without waiting while the firing job holds a due timer's key).
--
-- queen.timer_get_v2(tenant, queue, timer_key): zero or one row, the pending timer. Reads only. (v1 also
--   returned fired_at, a column that is gone; it is dropped here.)
-- queen.timer_list_v1(tenant, queue, after, limit): pending timers of one queue with timer_key > after
--   (NULL = from the start), by timer_key, at most limit + 1 rows (the extra row tells the caller the
--   page is truncated). Reads only. Replaced by timer_list_v2; kept for the previous release's brokers
--   during a rolling deploy (000_dropped.sql drops it one release later).
-- queen.timer_list_v2(tenant, queue, after, limit, max_bytes) -> jsonb
--   Called by: GET /api/v1/timers/{queue} (queen_pg/engine/timers.py). The page of timer_list_v1 as the
--   answer's JSON: {"rows": [{timerKey, txn, deliverAt, messageId, partition}], "truncated",
--   "nextAfter"}, limit clamped to 1..1000. It also stops before the row that would take its rows'
--   JSON text past max_bytes (the answer budget, queen_pg/engine/answers.py; at least one row; NULL =
--   no limit): truncated, nextAfter = its last row's timerKey. A txn may be 64 KiB, so a full page
--   could be 64 MiB: rows past the budget are never read. Locks: none (a read). Raises nothing.
--
-- queen.timers_fire_v1(p_limit, p_now) -> jsonb
--   Called by: the timers job (queen_pg/jobs/timers.py).
--   1. TIMERS_FIRE_LOCK = 7_781_200_186 (try): one replica per tick; the loser returns leader=false.
--   2. Up to p_limit due timers (deliver_at <= now), oldest first; each key's lock taken shared with a
--      try-lock (a busy key is counted in `busy` and left for the next tick).
--   3. Per tenant (ascending): the locked keys' rows read again FOR UPDATE SKIP LOCKED, still due;
--      their missing queues and partitions created (queues FOR UPDATE, docs/architecture.md#lock-order #1).
--   4. Every partition those rows go to, of every tenant, FOR NO KEY UPDATE in ONE ascending id order
--      (#2): the per-tenant pushes below then take no lock out of order (retention locks across
--      tenants too, ascending).
--   5. Per tenant: ONE queen.push_v1 call (one raw segment per queue/partition, frames in deliver_at
--      order; the scheduler's producer_sub as flag 2; a sealed payload keeps flag 4 through
--      queen._frame, the push checks no sealing since every frame says its own). A txn already in the partition's dedup window is a duplicate and
--      pushes nothing. Then every pushed row is deleted (in the same transaction).
--   Result {"leader", "fired" (queued), "duplicates", "busy", "queues": [[tenant, queue], ...]
--   that received a message}. Exactly once: the leader lock, the key lock + row lock + the row's delete,
--   and the push's own dedup by txn hash.
-- Errors: none of their own; a queue deleted while the fire pushes into it surfaces as a foreign-key
--   violation (503 retry for a route; the job logs it and retries the next tick).

CREATE OR REPLACE FUNCTION queen._timer_hash(p_tenant text, p_queue text, p_key text)
RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT hashtext(p_tenant || E'\x1f' || p_queue || E'\x1f' || p_key);
$$;

CREATE OR REPLACE FUNCTION queen._timer_lock(p_tenant text, p_queues text[], p_keys text[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_hash integer;
BEGIN
    FOR v_hash IN
        SELECT DISTINCT queen._timer_hash(p_tenant, u.queue, u.key)
          FROM unnest(p_queues, p_keys) AS u(queue, key)
         ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock(77813, v_hash);  -- TIMER_KEY_CLASS
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION queen._timer_apply(
    p_tenant text, p_op jsonb, p_payload bytea, p_txn_hash uuid, p_message_id uuid, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := coalesce(p_now, clock_timestamp());
    v_queue  text := p_op ->> 'queue';
    v_key    text := p_op ->> 'timerKey';
    v_txn    text := p_op ->> 'txn';
    v_part   text := coalesce(p_op ->> 'partition', 'Default');
    t        queen.timers%ROWTYPE;
    v_found  boolean;
    v_at     timestamptz;
    v_id     uuid;
    v_status text;
    v_enc    boolean;
BEGIN
    SELECT tm.* INTO t FROM queen.timers tm
     WHERE tm.tenant = p_tenant AND tm.queue = v_queue AND tm.timer_key = v_key
       FOR UPDATE;
    v_found := FOUND;

    IF p_op ->> 'op' = 'cancel' THEN
        IF NOT v_found OR (v_txn IS NOT NULL AND t.txn <> v_txn) THEN
            RETURN jsonb_build_object('ok', false, 'status', 'absent', 'queue', v_queue, 'timerKey', v_key,
                                      'txn', v_txn);
        END IF;
        DELETE FROM queen.timers tm WHERE tm.tenant = p_tenant AND tm.queue = v_queue AND tm.timer_key = v_key;
        RETURN jsonb_build_object('ok', true, 'status', 'cancelled', 'queue', v_queue, 'timerKey', v_key,
                                  'txn', t.txn, 'messageId', t.message_id);
    END IF;

    -- an encrypted queue's timer keeps its payload sealed (queen_pg/security/crypto.py: a sealed payload
    -- starts with a NUL byte); a disagreement writes nothing and the broker calls again, sealed as told
    v_enc := coalesce((SELECT q.encryption_enabled FROM queen.queues q
                        WHERE q.tenant = p_tenant AND q.name = v_queue), false);
    IF v_enc <> (substring(p_payload FROM 1 FOR 1) = '\x00'::bytea) THEN
        PERFORM queen._refuse('encryption_mismatch', jsonb_build_object(v_queue, v_enc)::text);
    END IF;
    v_status := CASE WHEN v_found THEN 'rescheduled' ELSE 'scheduled' END;
    v_id := CASE WHEN v_found AND t.txn = v_txn THEN t.message_id ELSE p_message_id END;
    v_at := v_now + (p_op ->> 'delayMs')::bigint * interval '1 millisecond';
    INSERT INTO queen.timers AS tm (tenant, queue, timer_key, partition, payload, txn, txn_hash, message_id,
                                    deliver_at, created_at, updated_at, producer_sub)
    VALUES (p_tenant, v_queue, v_key, v_part, p_payload, v_txn, p_txn_hash, v_id, v_at, v_now, v_now,
            p_op ->> 'producerSub')
    ON CONFLICT ON CONSTRAINT timers_pkey DO UPDATE
       SET partition = excluded.partition, payload = excluded.payload, txn = excluded.txn,
           txn_hash = excluded.txn_hash, message_id = excluded.message_id, deliver_at = excluded.deliver_at,
           updated_at = excluded.updated_at, producer_sub = excluded.producer_sub;
    RETURN jsonb_build_object('ok', true, 'status', v_status, 'queue', v_queue, 'timerKey', v_key, 'txn', v_txn,
                              'messageId', v_id, 'deliverAt', queen._iso_utc(v_at), 'partition', v_part);
END;
$$;

CREATE OR REPLACE FUNCTION queen.timers_v1(
    p_tenant   text,
    p_ops      jsonb,
    p_payloads bytea[],
    p_hashes   uuid[],
    p_msgids   uuid[],
    p_now      timestamptz DEFAULT NULL
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_results jsonb := '[]'::jsonb;
    v_op      jsonb;
    i         integer;
BEGIN
    IF jsonb_array_length(coalesce(p_ops, '[]'::jsonb)) = 0 THEN
        RETURN jsonb_build_object('results', v_results);
    END IF;
    PERFORM queen._timer_lock(p_tenant, array_agg(o ->> 'queue'), array_agg(o ->> 'timerKey'))
       FROM jsonb_array_elements(p_ops) AS o;
    FOR v_op, i IN SELECT e.v, e.ord::integer FROM jsonb_array_elements(p_ops) WITH ORDINALITY AS e(v, ord) LOOP
        v_results := v_results
            || jsonb_build_array(queen._timer_apply(p_tenant, v_op, p_payloads[i], p_hashes[i], p_msgids[i], v_now));
    END LOOP;
    RETURN jsonb_build_object('results', v_results);
END;
$$;

CREATE OR REPLACE FUNCTION queen.timer_cancel_v1(
    p_tenant text, p_queue text, p_key text, p_txn text, p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := coalesce(p_now, clock_timestamp());
    v_hash integer := queen._timer_hash(p_tenant, p_queue, p_key);
    t      queen.timers%ROWTYPE;
BEGIN
    IF NOT pg_try_advisory_xact_lock(77813, v_hash) THEN  -- TIMER_KEY_CLASS
        IF pg_try_advisory_xact_lock_shared(77813, v_hash) THEN
            -- Only shared holders, i.e. the firing job: a due timer of this key is being fired (its
            -- row, deleted by the fire, is still visible until the fire commits).
            SELECT tm.* INTO t FROM queen.timers tm
             WHERE tm.tenant = p_tenant AND tm.queue = p_queue AND tm.timer_key = p_key;
            IF FOUND AND t.deliver_at <= v_now AND (p_txn IS NULL OR t.txn = p_txn) THEN
                RETURN jsonb_build_object('ok', false, 'status', 'too_late', 'queue', p_queue, 'timerKey', p_key,
                                          'txn', t.txn, 'messageId', t.message_id);
            END IF;
            -- Not due (the fire holds a colliding key's hash): the fire leaves it alone. Decided below
            -- under the row lock, which also waits for a fire that did take the row (then: absent).
        ELSE
            PERFORM pg_advisory_xact_lock(77813, v_hash);  -- a writer holds the key: wait for it
        END IF;
    END IF;
    RETURN queen._timer_apply(
        p_tenant, jsonb_build_object('op', 'cancel', 'queue', p_queue, 'timerKey', p_key, 'txn', p_txn),
        NULL, NULL, NULL, v_now);
END;
$$;

CREATE OR REPLACE FUNCTION queen.timer_get_v2(p_tenant text, p_queue text, p_key text)
RETURNS TABLE (partition text, payload bytea, txn text, message_id uuid, deliver_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT t.partition, t.payload, t.txn, t.message_id, t.deliver_at
      FROM queen.timers t
     WHERE t.tenant = p_tenant AND t.queue = p_queue AND t.timer_key = p_key;
$$;

CREATE OR REPLACE FUNCTION queen.timer_list_v1(p_tenant text, p_queue text, p_after text, p_limit integer)
RETURNS TABLE (timer_key text, txn text, deliver_at timestamptz, message_id uuid, partition text)
LANGUAGE sql STABLE AS $$
    SELECT t.timer_key, t.txn, t.deliver_at, t.message_id, t.partition
      FROM queen.timers t
     WHERE t.tenant = p_tenant AND t.queue = p_queue
       AND (p_after IS NULL OR t.timer_key > p_after)
     ORDER BY t.timer_key
     LIMIT greatest(p_limit, 1) + 1;
$$;

CREATE OR REPLACE FUNCTION queen.timer_list_v2(
    p_tenant text, p_queue text, p_after text, p_limit integer, p_max_bytes bigint)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_limit integer := least(greatest(coalesce(p_limit, 100), 1), 1000);
    v_row   record;
    v_json  jsonb;
    v_size  bigint;
    v_used  bigint := 0;
    v_rows  jsonb[] := '{}';
    v_more  boolean := false;
BEGIN
    FOR v_row IN
        SELECT t.timer_key, t.txn, t.deliver_at, t.message_id, t.partition
          FROM queen.timers t
         WHERE t.tenant = p_tenant AND t.queue = p_queue
           AND (p_after IS NULL OR t.timer_key > p_after)
         ORDER BY t.timer_key
         LIMIT v_limit + 1
    LOOP
        IF cardinality(v_rows) = v_limit THEN
            v_more := true;
            EXIT;
        END IF;
        v_json := jsonb_build_object('timerKey', v_row.timer_key, 'txn', v_row.txn,
                                     'deliverAt', queen._iso_utc(v_row.deliver_at),
                                     'messageId', v_row.message_id::text, 'partition', v_row.partition);
        v_size := octet_length(v_json::text);
        IF cardinality(v_rows) > 0 AND v_used + v_size > p_max_bytes THEN
            v_more := true;
            EXIT;
        END IF;
        v_used := v_used + v_size;
        v_rows := array_append(v_rows, v_json);
    END LOOP;
    RETURN jsonb_build_object('rows', to_jsonb(v_rows), 'truncated', v_more,
                              'nextAfter', CASE WHEN v_more THEN v_rows[cardinality(v_rows)]->>'timerKey' END);
END;
$$;

CREATE OR REPLACE FUNCTION queen.timers_fire_v1(p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_limit   integer := greatest(p_limit, 1);
    r         record;
    v_kt      text[] := '{}';   -- locked keys: tenant, queue, timer_key
    v_kq      text[] := '{}';
    v_kk      text[] := '{}';
    v_busy    integer := 0;
    v_tenant  text;
    v_iq      text[];           -- one entry per timer pushed in this tenant, in push order
    v_ik      text[];
    v_ip      text[];
    v_ig      integer[];
    v_ih      uuid[];
    v_im      uuid[];
    v_if      bytea[];
    v_gq      text[];           -- one entry per (queue, partition) group
    v_gp      text[];
    v_gb      bytea[];
    v_queued  integer;
    v_dups    integer;
    v_fired   integer := 0;
    v_dup_all integer := 0;
    v_queues  jsonb := '[]'::jsonb;
    v_pushed  jsonb;
BEGIN
    IF NOT pg_try_advisory_xact_lock(7781200186) THEN  -- TIMERS_FIRE_LOCK
        RETURN jsonb_build_object('leader', false, 'fired', 0, 'duplicates', 0, 'busy', 0, 'queues', '[]'::jsonb);
    END IF;

    -- 2. due timers; their key locks, shared, try only
    FOR r IN
        SELECT t.tenant, t.queue, t.timer_key FROM queen.timers t
         WHERE t.deliver_at <= v_now
         ORDER BY t.deliver_at, t.tenant, t.queue, t.timer_key
         LIMIT v_limit
    LOOP
        IF pg_try_advisory_xact_lock_shared(77813, queen._timer_hash(r.tenant, r.queue, r.timer_key)) THEN
            v_kt := v_kt || r.tenant;
            v_kq := v_kq || r.queue;
            v_kk := v_kk || r.timer_key;
        ELSE
            v_busy := v_busy + 1;
        END IF;
    END LOOP;

    -- 3. per tenant: rows again under row locks; their queues and partitions created when missing
    FOR v_tenant IN SELECT DISTINCT u.tn FROM unnest(v_kt) AS u(tn) ORDER BY 1 LOOP
        PERFORM 1 FROM queen.timers t
          JOIN unnest(v_kt, v_kq, v_kk) AS k(tn, q, key)
            ON t.tenant = k.tn AND t.queue = k.q AND t.timer_key = k.key
         WHERE k.tn = v_tenant AND t.deliver_at <= v_now
           FOR UPDATE OF t SKIP LOCKED;
        SELECT array_agg(d.queue ORDER BY d.queue, d.partition), array_agg(d.partition ORDER BY d.queue, d.partition)
          INTO v_gq, v_gp
          FROM (SELECT DISTINCT t.queue, t.partition
                  FROM queen.timers t
                  JOIN unnest(v_kt, v_kq, v_kk) AS k(tn, q, key)
                    ON t.tenant = k.tn AND t.queue = k.q AND t.timer_key = k.key
                 WHERE k.tn = v_tenant AND t.deliver_at <= v_now) AS d;
        CONTINUE WHEN v_gq IS NULL;
        INSERT INTO queen.queues (tenant, name)
        SELECT DISTINCT v_tenant, g.q FROM unnest(v_gq) AS g(q)
         WHERE NOT EXISTS (SELECT 1 FROM queen.queues q WHERE q.tenant = v_tenant AND q.name = g.q)
         ORDER BY 2
        ON CONFLICT (tenant, name) DO NOTHING;
        PERFORM queen._create_partitions(v_tenant, array_agg(q.id ORDER BY g.ord), array_agg(g.p ORDER BY g.ord))
           FROM unnest(v_gq, v_gp) WITH ORDINALITY AS g(q, p, ord)
           JOIN queen.queues q ON q.tenant = v_tenant AND q.name = g.q
         HAVING count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM queen.log_partitions lp
                                                    WHERE lp.queue_id = q.id AND lp.name = g.p)) > 0;
    END LOOP;

    -- 4. the partitions of every tenant's push, in one ascending order
    PERFORM 1 FROM queen.log_partitions lp
      JOIN queen.queues q ON q.id = lp.queue_id
      JOIN (SELECT DISTINCT t.tenant, t.queue, t.partition
              FROM queen.timers t
              JOIN unnest(v_kt, v_kq, v_kk) AS k(tn, q, key)
                ON t.tenant = k.tn AND t.queue = k.q AND t.timer_key = k.key
             WHERE t.deliver_at <= v_now) AS d
        ON q.tenant = d.tenant AND q.name = d.queue AND lp.name = d.partition
     ORDER BY lp.id
       FOR NO KEY UPDATE OF lp;

    -- 5. per tenant: one push, the rows deleted
    FOR v_tenant IN SELECT DISTINCT u.tn FROM unnest(v_kt) AS u(tn) ORDER BY 1 LOOP
        WITH due AS MATERIALIZED (
            SELECT t.queue, t.timer_key, t.partition, t.payload, t.txn, t.txn_hash, t.message_id, t.deliver_at,
                   t.producer_sub
              FROM queen.timers t
              JOIN unnest(v_kt, v_kq, v_kk) AS k(tn, q, key)
                ON t.tenant = k.tn AND t.queue = k.q AND t.timer_key = k.key
             WHERE k.tn = v_tenant AND t.deliver_at <= v_now
               FOR UPDATE OF t SKIP LOCKED
        ), ordered AS (
            SELECT d.*, dense_rank() OVER (ORDER BY d.queue, d.partition)::integer AS grp,
                   row_number() OVER (ORDER BY d.queue, d.partition, d.deliver_at, d.timer_key) AS ord
              FROM due d
        )
        SELECT array_agg(o.queue ORDER BY o.ord), array_agg(o.timer_key ORDER BY o.ord),
               array_agg(o.partition ORDER BY o.ord), array_agg(o.grp ORDER BY o.ord),
               array_agg(o.txn_hash ORDER BY o.ord), array_agg(o.message_id ORDER BY o.ord),
               array_agg(queen._frame(o.message_id, o.txn, o.payload, o.producer_sub) ORDER BY o.ord)
          INTO v_iq, v_ik, v_ip, v_ig, v_ih, v_im, v_if
          FROM ordered o;
        CONTINUE WHEN v_iq IS NULL;

        SELECT array_agg(g.queue ORDER BY g.grp), array_agg(g.partition ORDER BY g.grp),
               array_agg(g.blob ORDER BY g.grp)
          INTO v_gq, v_gp, v_gb
          FROM (SELECT u.grp, min(u.q) AS queue, min(u.p) AS partition,
                       string_agg(u.f, ''::bytea ORDER BY u.ord) AS blob
                  FROM unnest(v_ig, v_iq, v_ip, v_if) WITH ORDINALITY AS u(grp, q, p, f, ord)
                 GROUP BY u.grp) AS g;

        SELECT count(*) FILTER (WHERE pr.status = 'queued'), count(*) FILTER (WHERE pr.status <> 'queued'),
               coalesce(jsonb_agg(DISTINCT jsonb_build_array(v_tenant, v_iq[pr.idx]))
                            FILTER (WHERE pr.status = 'queued'), '[]'::jsonb)
          INTO v_queued, v_dups, v_pushed
          FROM queen.push_v1(v_tenant, v_gq, v_gp, v_gb, v_ig, v_ih, v_im, v_now,
                             array_fill(0::smallint, ARRAY[cardinality(v_gq)]),
                             array_fill(NULL::boolean, ARRAY[cardinality(v_gq)])) AS pr;

        DELETE FROM queen.timers t
         USING unnest(v_iq, v_ik) AS u(q, key)
         WHERE t.tenant = v_tenant AND t.queue = u.q AND t.timer_key = u.key;

        v_fired := v_fired + v_queued;
        v_dup_all := v_dup_all + v_dups;
        v_queues := v_queues || v_pushed;
    END LOOP;

    RETURN jsonb_build_object('leader', true, 'fired', v_fired, 'duplicates', v_dup_all, 'busy', v_busy,
                              'queues', v_queues);
END;
$$;
