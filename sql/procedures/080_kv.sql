-- KV: the key/value store behind POST /api/v1/kv (WIRE.md §2.6), the primitives the locks
-- (085_locks.sql) and the transaction procedure build on, and the expired-row sweep.
--
-- queen._kv_lock(tenant, ns[], keys[]) -> void
--   Takes pg_advisory_xact_lock(KV_KEY_CLASS = 77812, hashtext(tenant || E'\x1f' || ns || E'\x1f' || key))
--   for every distinct pair, in ascending order of the int4 hash. Every KV writer (/kv, /locks, the
--   transaction) takes ALL the keys it writes or checks in ONE call, before touching any row: level 0
--   of docs/locks.md, before timer keys, queues, partitions and consumers. The lock also covers keys
--   that do not exist yet. Two keys with one hash share a lock (harmless: more serialization).
--
-- queen._kv_apply(tenant, op jsonb, now) -> jsonb
--   Applies ONE op already validated by queen_pg/api/kv_ops.py; the caller holds the key's lock.
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
-- queen.kv_v1(tenant, ops jsonb, now) -> jsonb
--   Called by: POST /api/v1/kv (queen_pg/engine/kv.py). ops = the validated op list.
--   Locks: queen._kv_lock on every key the batch writes or checks (docs/locks.md #0); reads take none
--   (a read sees what committed before the statement, and what this batch wrote before it).
--   Result: {"results":[{index, op, ns, key?, ...}]}, one per op, in order.
--   Raises: queen._verdict('kv_precondition', {failedIndex, kvReason, version, value}) when a
--   `required` op lost its condition: the whole batch is rolled back, nothing is written.
--
-- queen.kv_sweep_v1(limit, now) -> integer
--   Called by: the kv_sweep job (queen_pg/jobs/kv_sweep.py). Deletes at most `limit` expired rows,
--   oldest expiry first; answers how many. Locks: KV_SWEEP_LOCK (try; losers return 0 at once),
--   then the rows FOR UPDATE SKIP LOCKED: a row a writer is rewriting is left for the next tick, and
--   the delete re-checks the expiry, so a row made live again meanwhile is never deleted. It takes
--   no key locks: writers already treat an expired row as absent, so deleting it changes no answer.

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

CREATE OR REPLACE FUNCTION queen._kv_get_many(p_tenant text, p_ns text, p_keys jsonb, p_now timestamptz)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    WITH req AS (
        SELECT e.key, min(e.ord) AS ord
          FROM jsonb_array_elements_text(p_keys) WITH ORDINALITY AS e(key, ord)
         GROUP BY e.key
    ), hit AS (
        SELECT req.ord, req.key, k AS hitrow
          FROM req
          LEFT JOIN queen.kv k
            ON k.tenant = p_tenant AND k.ns = p_ns AND k.key = req.key
           AND (k.expires_at IS NULL OR k.expires_at > p_now)
    )
    SELECT jsonb_build_object(
        'rows', coalesce(jsonb_agg(queen._kv_row_json(hit.hitrow) ORDER BY hit.ord)
                         FILTER (WHERE (hit.hitrow).key IS NOT NULL), '[]'::jsonb),
        'missing', coalesce(jsonb_agg(hit.key ORDER BY hit.ord)
                            FILTER (WHERE (hit.hitrow).key IS NULL), '[]'::jsonb))
      FROM hit
$$;

CREATE OR REPLACE FUNCTION queen._kv_get_prefix(p_tenant text, p_op jsonb, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_limit integer := least(greatest(coalesce((p_op->>'limit')::integer, 100), 1), 1000);
    v_keys_only boolean := coalesce((p_op->>'keysOnly')::boolean, false);
    v_rows jsonb;
    v_count integer;
    v_last text;
BEGIN
    WITH page AS (
        SELECT k
          FROM queen.kv k
         WHERE k.tenant = p_tenant AND k.ns = p_op->>'ns'
           AND starts_with(k.key, p_op->>'prefix')
           AND (p_op->>'after' IS NULL OR k.key COLLATE "C" > (p_op->>'after') COLLATE "C")
           AND (k.expires_at IS NULL OR k.expires_at > p_now)
         ORDER BY k.key COLLATE "C"
         LIMIT v_limit + 1
    ), numbered AS (
        SELECT page.k, row_number() OVER (ORDER BY (page.k).key COLLATE "C") AS n FROM page
    )
    SELECT coalesce(jsonb_agg(CASE WHEN v_keys_only THEN queen._kv_row_json(numbered.k) - 'value'
                                   ELSE queen._kv_row_json(numbered.k) END ORDER BY numbered.n)
                    FILTER (WHERE numbered.n <= v_limit), '[]'::jsonb),
           count(*),
           max((numbered.k).key) FILTER (WHERE numbered.n = v_limit)
      INTO v_rows, v_count, v_last
      FROM numbered;
    RETURN jsonb_build_object('prefix', p_op->>'prefix', 'rows', v_rows, 'truncated', v_count > v_limit,
                              'nextAfter', CASE WHEN v_count > v_limit THEN v_last END);
END;
$$;

CREATE OR REPLACE FUNCTION queen._kv_apply(p_tenant text, p_op jsonb, p_now timestamptz)
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
        RETURN v_head || queen._kv_get_many(p_tenant, v_ns, p_op->'keys', p_now);
    ELSIF v_op = 'getPrefix' THEN
        RETURN v_head || queen._kv_get_prefix(p_tenant, p_op, p_now);
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

CREATE OR REPLACE FUNCTION queen.kv_v1(p_tenant text, p_ops jsonb, p_now timestamptz DEFAULT NULL)
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
        v_result := queen._kv_apply(p_tenant, v_op, v_now);
        IF v_result ? '_lost' AND (v_op->>'required')::boolean IS TRUE THEN
            PERFORM queen._verdict('kv_precondition', jsonb_build_object(
                'failedIndex', v_index, 'kvReason', v_result->>'reason',
                'version', v_result->'version', 'value', v_result->'value'));
        END IF;
        v_results := v_results || jsonb_build_array(jsonb_build_object('index', v_index) || (v_result - '_lost'));
    END LOOP;
    RETURN jsonb_build_object('results', v_results);
END;
$$;

CREATE OR REPLACE FUNCTION queen.kv_sweep_v1(p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_deleted integer;
BEGIN
    IF NOT pg_try_advisory_xact_lock(7781200180) THEN  -- KV_SWEEP_LOCK
        RETURN 0;
    END IF;
    WITH doomed AS (
        SELECT k.tenant, k.ns, k.key
          FROM queen.kv k
         WHERE k.expires_at <= v_now
         ORDER BY k.expires_at
         LIMIT greatest(p_limit, 1)
           FOR UPDATE SKIP LOCKED
    )
    DELETE FROM queen.kv k
     USING doomed d
     WHERE k.tenant = d.tenant AND k.ns = d.ns AND k.key = d.key AND k.expires_at <= v_now;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END;
$$;
