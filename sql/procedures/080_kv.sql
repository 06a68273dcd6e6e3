-- KV: the key/value store behind POST /api/v1/kv (docs/wire.md#kv), the primitives the locks
-- (085_locks.sql) and the transaction procedure build on, and the expired-row sweep.
--
-- queen._kv_lock(tenant, ns[], keys[]) -> void
--   Takes pg_advisory_xact_lock(KV_KEY_CLASS = 77812, hashtext(tenant || E'\x1f' || ns || E'\x1f' || key))
--   for every distinct pair, in ascending order of the int4 hash. Every KV writer (/kv, /locks, the
--   transaction) takes ALL the keys it writes or checks in ONE call, before touching any row: level 0
--   of docs/architecture.md#lock-order, before timer keys, queues, partitions and consumers. The lock also covers keys
--   that do not exist yet. Two keys with one hash share a lock (harmless: more serialization).
--
-- queen._kv_apply(tenant, op jsonb, now[, max_bytes]) -> jsonb
--   Applies ONE op already validated by queen_pg/api/kv/ops.py; the caller holds the key's lock.
--   max_bytes (NULL or absent = no limit; the answer budget, queen_pg/engine/answers.py): a getPrefix
--   page also stops before the row that would take its rows past it (at least one row); getMany stops
--   reading once its rows pass it (the caller, queen._kv_run, then refuses the call).
--   Result: the op's WIRE object, {op, ns, key?, ...}:
--     get       {found:true, key, value, version, expiresAt, updatedAt} | {found:false}
--     getMany   {rows:[{key,value,version,expiresAt,updatedAt}], missing:[keys]} (request order)
--     getPrefix {rows, truncated, nextAfter}: byte order of key (COLLATE "C"), `after` exclusive,
--               limit default 100, clamped to 1..1000; keysOnly drops `value` from the rows
--     put | putIfAbsent | delete | incr | check
--               {applied:true, value, version, expiresAt} = the key as it is AFTER the op (an
--               applied delete answers value null, version 0), or
--               {applied:false, reason, value, version, expiresAt?, _lost:true} = the key as it is
--               (a missing key: value null, version 0; incr: value 0).
--   Reasons: exists (putIfAbsent, or expect 0, on a live key), version (expect <> version),
--   absent (expect > 0 on a missing key; delete of a missing key), limit (incr result outside
--   [min, max], or beyond the range of a JSON double: nothing written), type (incr on a value that
--   is not a JSON number). `_lost` marks every applied:false: callers escalate it for `required`
--   ops and strip it.
--   Rules: a row with expires_at <= now is absent everywhere (found by nothing, overwritten by
--   writes; the sweep deletes it later). Every write takes nextval('queen.kv_version_seq'), so
--   versions only grow, per key and across keys (a deleted then re-created key gets a higher one).
--   ttlSeconds -> expires_at = now + ttl; forever -> NULL. incr counts a missing or expired row as
--   0 and applies its TTL only when it creates the row: a live row keeps its expiry. Time only from
--   p_now (NULL = now()).
--
-- queen._kv_run(tenant, ops jsonb, now, max_bytes) -> jsonb
--   The batch of POST /api/v1/kv, called by queen.kv_v3 (096_outcomes.sql; queen_pg/engine/kv.py).
--   ops = the validated op list.
--   Locks: queen._kv_lock on every key the batch writes or checks (docs/architecture.md#lock-order #0); reads take none
--   (a read sees what committed before the statement, and what this batch wrote before it).
--   Result: {"results":[{index, op, ns, key?, ...}]}, one per op, in order.
--   Raises: queen._verdict('kv_precondition', {failedIndex, kvReason, version, value}) when a
--   `required` op lost its condition: the whole batch is rolled back, nothing is written.
--   The answer budget (max_bytes, NULL = none): each op may take what the ops before it left
--   (see _kv_apply), and once the results pass max_bytes (queen._kv_charge below: the rule the
--   transaction shares) the call is refused with queen._refuse('answer_too_large', ...) (413 in the
--   broker; the detail names the limit): the batch is rolled back, nothing is written, and no more op
--   is read.
--
-- queen._kv_charge(used, op, result, max_bytes, label, index) -> bigint
--   The answer budget's rule for a list of KV results, shared by queen._kv_run and
--   queen.transaction_v1 (095_transaction.sql): answers `used` plus the bytes of `result` (its JSON
--   text, less the value of an applied put or putIfAbsent: the request's own bytes, echoed); past
--   max_bytes (NULL = no budget: nothing counted) it refuses the call with
--   queen._refuse('answer_too_large', ...) naming `label[0..index]` and the limit. The caller's
--   statement aborts: nothing of it is written.
--
-- queen.kv_sweep_v1(limit, now) -> integer
--   Called by: the kv_sweep job (queen_pg/jobs/kv_sweep.py). Deletes at most `limit` expired rows,
--   oldest expiry first; answers how many (queen._expired_sweep, 001_internal.sql). Locks: KV_SWEEP_LOCK
--   (try; losers return 0 at once), then the rows FOR UPDATE SKIP LOCKED: a row a writer is rewriting is
--   left for the next tick, and the delete re-checks the expiry, so a row made live again meanwhile is
--   never deleted. It takes no key locks: writers already treat an expired row as absent, so deleting it changes no answer.

CREATE OR REPLACE FUNCTION queen._kv_lock(p_tenant text, p_ns text[], p_keys text[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_hash integer;
BEGIN
    FOR v_hash IN
        SELECT DISTINCT hashtext(p_tenant || E'\x1f' || u.ns || E'\x1f' || u.key)
          FROM unnest(p_ns, p_keys) AS u(ns, key)
         ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock(77812, v_hash);  -- KV_KEY_CLASS
    END LOOP;
END;
$$;

-- The public fields of a row: {key, value, version, expiresAt, updatedAt}.
CREATE OR REPLACE FUNCTION queen._kv_row_json(p_row queen.kv)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('key', p_row.key, 'value', p_row.value, 'version', p_row.version,
                              'expiresAt', queen._iso_utc(p_row.expires_at),
                              'updatedAt', queen._iso_utc(p_row.updated_at))
$$;

-- The failed condition of `expect` against the live row (NULL = it holds, or no expect given).
CREATE OR REPLACE FUNCTION queen._kv_condition(p_found boolean, p_version bigint, p_expect bigint)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_expect IS NULL THEN NULL
                WHEN p_expect = 0 THEN CASE WHEN p_found THEN 'exists' END
                WHEN NOT p_found THEN 'absent'
                WHEN p_version <> p_expect THEN 'version'
           END
$$;

-- applied:false with the key as it is (value null / version 0 when it is absent).
CREATE OR REPLACE FUNCTION queen._kv_lost(p_reason text, p_found boolean, p_row queen.kv)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('applied', false, 'reason', p_reason, '_lost', true)
        || CASE WHEN p_found
                THEN jsonb_build_object('value', p_row.value, 'version', p_row.version,
                                        'expiresAt', queen._iso_utc(p_row.expires_at))
                ELSE jsonb_build_object('value', NULL::jsonb, 'version', 0) END
$$;

CREATE OR REPLACE FUNCTION queen._kv_applied(p_row queen.kv)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('applied', true, 'value', p_row.value, 'version', p_row.version,
                              'expiresAt', queen._iso_utc(p_row.expires_at))
$$;

-- Upsert with a new version. An expired row being overwritten counts as a new key (created_at).
CREATE OR REPLACE FUNCTION queen._kv_write(
    p_tenant text, p_ns text, p_key text, p_value jsonb, p_expires_at timestamptz, p_now timestamptz)
RETURNS queen.kv
LANGUAGE sql AS $$
    INSERT INTO queen.kv AS k (tenant, ns, key, value, version, expires_at, created_at, updated_at)
    VALUES (p_tenant, p_ns, p_key, p_value, nextval('queen.kv_version_seq'), p_expires_at, p_now, p_now)
    ON CONFLICT (tenant, ns, key) DO UPDATE
       SET value = excluded.value,
           version = excluded.version,
           expires_at = excluded.expires_at,
           created_at = CASE WHEN k.expires_at IS NOT NULL AND k.expires_at <= p_now
                             THEN excluded.created_at ELSE k.created_at END,
           updated_at = excluded.updated_at
    RETURNING k.*
$$;

-- getMany: the live rows in request order (a key asked twice: its first place), the missing keys.
-- p_max_bytes (NULL = no limit): the rows stop once their JSON text passes it (the caller refuses).
CREATE OR REPLACE FUNCTION queen._kv_get_many(
    p_tenant text, p_ns text, p_keys jsonb, p_now timestamptz, p_max_bytes bigint)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_key     text;
    v_row     queen.kv;
    v_json    jsonb;
    v_rows    jsonb[] := '{}';
    v_missing text[] := '{}';
    v_used    bigint := 0;
BEGIN
    FOR v_key IN
        SELECT e.key FROM jsonb_array_elements_text(p_keys) WITH ORDINALITY AS e(key, ord)
         GROUP BY e.key ORDER BY min(e.ord)
    LOOP
        SELECT * INTO v_row FROM queen.kv k
         WHERE k.tenant = p_tenant AND k.ns = p_ns AND k.key = v_key
           AND (k.expires_at IS NULL OR k.expires_at > p_now);
        IF NOT FOUND THEN
            v_missing := array_append(v_missing, v_key);
            CONTINUE;
        END IF;
        v_json := queen._kv_row_json(v_row);
        v_rows := array_append(v_rows, v_json);
        v_used := v_used + octet_length(v_json::text);
        EXIT WHEN v_used > p_max_bytes;  -- over the budget: the caller refuses the call
    END LOOP;
    RETURN jsonb_build_object('rows', to_jsonb(v_rows), 'missing', to_jsonb(v_missing));
END;
$$;

-- getPrefix: a keyset page. p_max_bytes (NULL = no limit): the page also stops before the row that
-- would take its rows' JSON text past it (truncated, nextAfter = the last row shown); its first row is
-- always shown (the caller measures the answer). Rows are read one at a time: a page that stops early
-- reads one row past it, never the whole `limit`.
CREATE OR REPLACE FUNCTION queen._kv_get_prefix(p_tenant text, p_op jsonb, p_now timestamptz, p_max_bytes bigint)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_limit     integer := least(greatest(coalesce((p_op->>'limit')::integer, 100), 1), 1000);
    v_keys_only boolean := coalesce((p_op->>'keysOnly')::boolean, false);
    v_row       queen.kv;
    v_json      jsonb;
    v_size      bigint;
    v_used      bigint := 0;
    v_rows      jsonb[] := '{}';
    v_more      boolean := false;
BEGIN
    FOR v_row IN
        SELECT k.*
          FROM queen.kv k
         WHERE k.tenant = p_tenant AND k.ns = p_op->>'ns'
           AND starts_with(k.key, p_op->>'prefix')
           AND (p_op->>'after' IS NULL OR k.key COLLATE "C" > (p_op->>'after') COLLATE "C")
           AND (k.expires_at IS NULL OR k.expires_at > p_now)
         ORDER BY k.key COLLATE "C"
         LIMIT v_limit + 1
    LOOP
        IF cardinality(v_rows) = v_limit THEN
            v_more := true;
            EXIT;
        END IF;
        v_json := queen._kv_row_json(v_row);
        IF v_keys_only THEN
            v_json := v_json - 'value';
        END IF;
        v_size := octet_length(v_json::text);
        IF cardinality(v_rows) > 0 AND v_used + v_size > p_max_bytes THEN
            v_more := true;
            EXIT;
        END IF;
        v_used := v_used + v_size;
        v_rows := array_append(v_rows, v_json);
    END LOOP;
    RETURN jsonb_build_object('prefix', p_op->>'prefix', 'rows', to_jsonb(v_rows), 'truncated', v_more,
                              'nextAfter', CASE WHEN v_more THEN v_rows[cardinality(v_rows)]->>'key' END);
END;
$$;

CREATE OR REPLACE FUNCTION queen._kv_apply(p_tenant text, p_op jsonb, p_now timestamptz, p_max_bytes bigint)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_op      text := p_op->>'op';
    v_ns      text := p_op->>'ns';
    v_key     text := p_op->>'key';
    v_expect  bigint := (p_op->>'expect')::bigint;
    v_expires timestamptz;
    v_head    jsonb;
    v_row     queen.kv;
    v_found   boolean;
    v_reason  text;
    v_count   numeric;
BEGIN
    p_now := coalesce(p_now, now());
    v_head := jsonb_build_object('op', v_op, 'ns', v_ns);
    IF v_op = 'getMany' THEN
        RETURN v_head || queen._kv_get_many(p_tenant, v_ns, p_op->'keys', p_now, p_max_bytes);
    ELSIF v_op = 'getPrefix' THEN
        RETURN v_head || queen._kv_get_prefix(p_tenant, p_op, p_now, p_max_bytes);
    END IF;

    v_head := v_head || jsonb_build_object('key', v_key);
    SELECT * INTO v_row
      FROM queen.kv k
     WHERE k.tenant = p_tenant AND k.ns = v_ns AND k.key = v_key
       AND (k.expires_at IS NULL OR k.expires_at > p_now);
    v_found := FOUND;
    v_expires := CASE WHEN (p_op->>'forever')::boolean IS TRUE THEN NULL
                      ELSE p_now + (p_op->>'ttlSeconds')::bigint * interval '1 second' END;

    CASE v_op
    WHEN 'get' THEN
        IF v_found THEN
            RETURN v_head || jsonb_build_object('found', true) || queen._kv_row_json(v_row);
        END IF;
        RETURN v_head || jsonb_build_object('found', false);

    WHEN 'check' THEN
        v_reason := queen._kv_condition(v_found, v_row.version, v_expect);
        IF v_reason IS NOT NULL THEN
            RETURN v_head || queen._kv_lost(v_reason, v_found, v_row);
        ELSIF v_found THEN
            RETURN v_head || queen._kv_applied(v_row);
        END IF;
        RETURN v_head || jsonb_build_object('applied', true, 'value', NULL::jsonb, 'version', 0);

    WHEN 'put', 'putIfAbsent' THEN
        IF v_op = 'putIfAbsent' THEN
            v_expect := 0;
        END IF;
        v_reason := queen._kv_condition(v_found, v_row.version, v_expect);
        IF v_reason IS NOT NULL THEN
            RETURN v_head || queen._kv_lost(v_reason, v_found, v_row);
        END IF;
        v_row := queen._kv_write(p_tenant, v_ns, v_key, p_op->'value', v_expires, p_now);
        RETURN v_head || queen._kv_applied(v_row);

    WHEN 'delete' THEN
        v_reason := coalesce(queen._kv_condition(v_found, v_row.version, v_expect),
                             CASE WHEN NOT v_found THEN 'absent' END);
        IF v_reason IS NOT NULL THEN
            RETURN v_head || queen._kv_lost(v_reason, v_found, v_row);
        END IF;
        DELETE FROM queen.kv k WHERE k.tenant = p_tenant AND k.ns = v_ns AND k.key = v_key;
        RETURN v_head || jsonb_build_object('applied', true, 'value', NULL::jsonb, 'version', 0);

    WHEN 'incr' THEN
        IF v_found AND jsonb_typeof(v_row.value) IS DISTINCT FROM 'number' THEN
            RETURN v_head || queen._kv_lost('type', v_found, v_row);
        END IF;
        v_count := CASE WHEN v_found THEN v_row.value::numeric ELSE 0 END
                 + coalesce((p_op->>'delta')::numeric, 1);
        IF v_count < (p_op->>'min')::numeric OR v_count > (p_op->>'max')::numeric
           OR abs(v_count) > 1.7976931348623157e308 THEN  -- beyond a JSON double: never stored
            IF v_found THEN
                RETURN v_head || queen._kv_lost('limit', true, v_row);
            END IF;
            RETURN v_head || jsonb_build_object('applied', false, 'reason', 'limit', 'value', 0,
                                                'version', 0, '_lost', true);
        END IF;
        IF v_found THEN
            v_expires := v_row.expires_at;  -- the TTL applies only on create
        END IF;
        v_row := queen._kv_write(p_tenant, v_ns, v_key, to_jsonb(v_count), v_expires, p_now);
        RETURN v_head || queen._kv_applied(v_row);

    ELSE
        RAISE EXCEPTION 'queen._kv_apply: unknown op %', v_op;
    END CASE;
END;
$$;

CREATE OR REPLACE FUNCTION queen._kv_apply(p_tenant text, p_op jsonb, p_now timestamptz)
RETURNS jsonb
LANGUAGE sql AS $$
    SELECT queen._kv_apply(p_tenant, p_op, p_now, NULL::bigint)
$$;

CREATE OR REPLACE FUNCTION queen._kv_charge(
    p_used bigint, p_op jsonb, p_result jsonb, p_max_bytes bigint, p_label text, p_index integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_used bigint;
BEGIN
    IF p_max_bytes IS NULL THEN
        RETURN p_used;
    END IF;
    v_used := p_used + octet_length(CASE WHEN p_op->>'op' IN ('put', 'putIfAbsent')
                                              AND (p_result->>'applied')::boolean
                                         THEN p_result - 'value' ELSE p_result END::text);
    IF v_used > p_max_bytes THEN
        PERFORM queen._refuse('answer_too_large', format(
            'the answer to %s[0..%s] passes %s bytes, the broker''s answer budget '
            '(QUEEN_MAX_ANSWER_BYTES); nothing was applied: ask for less per call (fewer or '
            'narrower reads: split a getMany, page getPrefix with limit and after)', p_label, p_index, p_max_bytes));
    END IF;
    RETURN v_used;
END;
$$;

CREATE OR REPLACE FUNCTION queen._kv_run(p_tenant text, p_ops jsonb, p_now timestamptz, p_max_bytes bigint)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz;
    v_ns      text[];
    v_keys    text[];
    v_op      jsonb;
    v_index   integer;
    v_result  jsonb;
    v_results jsonb := '[]'::jsonb;
    v_used    bigint := 0;
BEGIN
    SELECT array_agg(o->>'ns'), array_agg(o->>'key')
      INTO v_ns, v_keys
      FROM jsonb_array_elements(p_ops) AS o
     WHERE o->>'op' IN ('put', 'putIfAbsent', 'delete', 'incr', 'check');
    IF v_keys IS NOT NULL THEN
        PERFORM queen._kv_lock(p_tenant, v_ns, v_keys);
    END IF;
    -- read the clock after the key locks: a TTL must not be granted already spent on the wait
    v_now := coalesce(p_now, clock_timestamp());

    FOR v_op, v_index IN
        SELECT e.op, (e.ord - 1)::integer FROM jsonb_array_elements(p_ops) WITH ORDINALITY AS e(op, ord) ORDER BY e.ord
    LOOP
        v_result := queen._kv_apply(p_tenant, v_op, v_now, p_max_bytes - v_used);
        IF v_result ? '_lost' AND (v_op->>'required')::boolean IS TRUE THEN
            PERFORM queen._verdict('kv_precondition', jsonb_build_object(
                'failedIndex', v_index, 'kvReason', v_result->>'reason',
                'version', v_result->'version', 'value', v_result->'value'));
        END IF;
        v_result := jsonb_build_object('index', v_index) || (v_result - '_lost');
        v_used := queen._kv_charge(v_used, v_op, v_result, p_max_bytes, 'operations', v_index);
        v_results := v_results || jsonb_build_array(v_result);
    END LOOP;
    RETURN jsonb_build_object('results', v_results);
END;
$$;

CREATE OR REPLACE FUNCTION queen.kv_sweep_v1(p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE sql AS $$
    SELECT queen._expired_sweep(7781200180, 'queen.kv', '{tenant, ns, key}', p_limit, p_now)  -- KV_SWEEP_LOCK
$$;
