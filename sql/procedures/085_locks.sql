-- Locks and semaphores: POST /api/v1/locks (docs/wire.md#locks), built on the KV (080_kv.sql).
--
-- A permit is the KV row (ns 'queen-locks', key '<name>#<slot>'), slots 0..limit-1, value
-- {"owner", "since", "renewedAt"} (ISO-8601 UTC), expires_at = the permit's deadline. Its token is
-- the row's version: it comes from queen.kv_version_seq, so it only grows, and every renew rewrites
-- the row (a new, higher token). The guard a holder pastes into a transaction is the KV op
-- {"op":"check","ns":"queen-locks","key":"<name>#<slot>","expect":<token>,"required":true}: it holds
-- only while the permit is live and not rewritten by anybody. An expired permit is an absent key.
--
-- queen.locks_v1(tenant, ops jsonb, now) -> jsonb
--   Called by: POST /api/v1/locks (queen_pg/engine/locks.py). ops = validated by
--   queen_pg/api/kv/ops.py (name without '#', ttlSeconds > 0, limit 1..1024, token > 0, slot >= 0).
--   Result: {"results":[{index, op, name, ...}]}, exactly one per op, in order:
--     acquire {acquired:true, slot, token, owner, guard, expiresAt, already?:true}
--             | {acquired:false, reason:'held' (limit 1) | 'contended', holders}
--             The owner already holding a live slot of 0..limit-1 gets that permit back unchanged
--             (already:true, same token). Otherwise the lowest free slot (none, or expired) is
--             written. A missing owner gets a minted one ('anonymous:<uuid>').
--     renew   {renewed:true, slot, token (new), owner, guard, expiresAt}
--             | {renewed:false, reason:'lost', holders}: the permit must be live and its token or
--             its owner must match. Without `slot` the permit is looked up by token, then by owner.
--     release {released:true, slot} | {released:false, reason:'lost'}: token must be the live
--             permit's. Without `slot` the permit is looked up by token.
--     get     {held, holders:[{slot, owner, token, since, expiresAt, renewedAt}]} (live permits,
--             ascending slot).
--   The ops are independent (one answer each, nothing all-or-nothing), but run in one transaction.
--   Locks: ONE queen._kv_lock call before any write, over every slot key the batch may write: all
--   of 0..limit-1 for an acquire, the permit's key for renew/release (found by a read first; if it
--   changed by the time the lock is held, the op answers lost). docs/architecture.md#lock-order #0. An acquire of a
--   semaphore of n therefore holds n advisory locks until commit; the route caps the sum at 1024.
--   Raises nothing of its own.

-- Live permits of a lock, by slot: [{slot, owner, token, since, expiresAt, renewedAt}].
CREATE OR REPLACE FUNCTION queen._lock_holders(p_tenant text, p_name text, p_now timestamptz)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'slot', s.slot, 'owner', k.value->>'owner', 'token', k.version,
               'since', k.value->'since', 'expiresAt', queen._iso_utc(k.expires_at),
               'renewedAt', k.value->'renewedAt') ORDER BY s.slot), '[]'::jsonb)
      FROM queen.kv k
     CROSS JOIN LATERAL (SELECT substr(k.key, length(p_name) + 2) AS suffix) x
     CROSS JOIN LATERAL (SELECT CASE WHEN x.suffix ~ '^[0-9]{1,9}$' THEN x.suffix::integer END AS slot) s
     WHERE k.tenant = p_tenant AND k.ns = 'queen-locks'
       AND starts_with(k.key, p_name || '#') AND s.slot IS NOT NULL
       AND (k.expires_at IS NULL OR k.expires_at > p_now)
$$;

CREATE OR REPLACE FUNCTION queen._lock_guard(p_name text, p_slot integer, p_token bigint)
RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('op', 'check', 'ns', 'queen-locks', 'key', p_name || '#' || p_slot,
                              'expect', p_token, 'required', true)
$$;

-- The slot of the live permit with this token, else (p_owner given) the lowest one of this owner.
CREATE OR REPLACE FUNCTION queen._lock_find(
    p_tenant text, p_name text, p_token bigint, p_owner text, p_now timestamptz)
RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT (h->>'slot')::integer
      FROM jsonb_array_elements(queen._lock_holders(p_tenant, p_name, p_now)) AS h
     WHERE (h->>'token')::bigint = p_token OR (p_owner IS NOT NULL AND h->>'owner' = p_owner)
     ORDER BY (h->>'token')::bigint = p_token DESC, (h->>'slot')::integer
     LIMIT 1
$$;

-- A permit written by this call: the answer acquire and renew share.
CREATE OR REPLACE FUNCTION queen._lock_won(p_name text, p_slot integer, p_owner text, p_kv jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('slot', p_slot, 'token', p_kv->'version', 'owner', p_owner,
                              'guard', queen._lock_guard(p_name, p_slot, (p_kv->>'version')::bigint),
                              'expiresAt', p_kv->'expiresAt')
$$;

CREATE OR REPLACE FUNCTION queen._lock_acquire(p_tenant text, p_op jsonb, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_name    text := p_op->>'name';
    v_limit   integer := coalesce((p_op->>'limit')::integer, 1);
    v_owner   text := coalesce(p_op->>'owner', 'anonymous:' || gen_random_uuid());
    v_holders jsonb := queen._lock_holders(p_tenant, v_name, p_now);
    v_mine    jsonb;
    v_slot    integer;
    v_stamp   text := queen._iso_utc(p_now);
    v_kv      jsonb;
BEGIN
    SELECT h INTO v_mine
      FROM jsonb_array_elements(v_holders) AS h
     WHERE h->>'owner' = v_owner AND (h->>'slot')::integer < v_limit
     ORDER BY (h->>'slot')::integer
     LIMIT 1;
    IF v_mine IS NOT NULL THEN  -- a resend by the holder: the same permit, untouched
        RETURN jsonb_build_object('acquired', true, 'already', true)
            || queen._lock_won(v_name, (v_mine->>'slot')::integer, v_owner,
                               jsonb_build_object('version', v_mine->'token', 'expiresAt', v_mine->'expiresAt'));
    END IF;

    SELECT min(s) INTO v_slot
      FROM generate_series(0, v_limit - 1) AS s
     WHERE NOT EXISTS (SELECT 1 FROM jsonb_array_elements(v_holders) AS h WHERE (h->>'slot')::integer = s);
    IF v_slot IS NULL THEN
        RETURN jsonb_build_object('acquired', false,
                                  'reason', CASE WHEN v_limit = 1 THEN 'held' ELSE 'contended' END,
                                  'holders', v_holders);
    END IF;

    v_kv := queen._kv_apply(p_tenant, jsonb_build_object(
        'op', 'put', 'ns', 'queen-locks', 'key', v_name || '#' || v_slot, 'expect', 0,
        'value', jsonb_build_object('owner', v_owner, 'since', v_stamp, 'renewedAt', v_stamp),
        'ttlSeconds', p_op->'ttlSeconds'), p_now);
    RETURN jsonb_build_object('acquired', true) || queen._lock_won(v_name, v_slot, v_owner, v_kv);
END;
$$;

CREATE OR REPLACE FUNCTION queen._lock_renew(p_tenant text, p_op jsonb, p_slot integer, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_name  text := p_op->>'name';
    v_token bigint := (p_op->>'token')::bigint;
    v_owner text := p_op->>'owner';
    v_row   queen.kv;
    v_kv    jsonb;
BEGIN
    SELECT * INTO v_row
      FROM queen.kv k
     WHERE k.tenant = p_tenant AND k.ns = 'queen-locks' AND k.key = v_name || '#' || p_slot
       AND (k.expires_at IS NULL OR k.expires_at > p_now);
    IF p_slot IS NULL OR NOT FOUND
       OR NOT (v_row.version = v_token OR v_row.value->>'owner' IS NOT DISTINCT FROM v_owner) THEN
        RETURN jsonb_build_object('renewed', false, 'reason', 'lost',
                                  'holders', queen._lock_holders(p_tenant, v_name, p_now));
    END IF;
    v_kv := queen._kv_apply(p_tenant, jsonb_build_object(
        'op', 'put', 'ns', 'queen-locks', 'key', v_row.key, 'expect', v_row.version,
        'value', v_row.value || jsonb_build_object('renewedAt', queen._iso_utc(p_now)),
        'ttlSeconds', p_op->'ttlSeconds'), p_now);
    RETURN jsonb_build_object('renewed', true) || queen._lock_won(v_name, p_slot, v_row.value->>'owner', v_kv);
END;
$$;

CREATE OR REPLACE FUNCTION queen._lock_release(p_tenant text, p_op jsonb, p_slot integer, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_kv jsonb;
BEGIN
    IF p_slot IS NOT NULL THEN
        v_kv := queen._kv_apply(p_tenant, jsonb_build_object(
            'op', 'delete', 'ns', 'queen-locks', 'key', (p_op->>'name') || '#' || p_slot,
            'expect', p_op->'token'), p_now);
        IF (v_kv->>'applied')::boolean THEN
            RETURN jsonb_build_object('released', true, 'slot', p_slot);
        END IF;
    END IF;
    RETURN jsonb_build_object('released', false, 'reason', 'lost');
END;
$$;

CREATE OR REPLACE FUNCTION queen.locks_v1(p_tenant text, p_ops jsonb, p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_n       integer := jsonb_array_length(p_ops);
    v_slots   integer[] := array_fill(NULL::integer, ARRAY[greatest(v_n, 1)]);
    v_keys    text[] := ARRAY[]::text[];
    v_op      jsonb;
    v_i       integer;
    v_name    text;
    v_result  jsonb;
    v_results jsonb := '[]'::jsonb;
BEGIN
    -- 1. every slot key the batch may write, so they are locked in one ascending pass
    FOR v_i IN 0 .. v_n - 1 LOOP
        v_op := p_ops->v_i;
        v_name := v_op->>'name';
        IF v_op->>'op' = 'acquire' THEN
            v_keys := v_keys || ARRAY(SELECT v_name || '#' || s
                                        FROM generate_series(0, coalesce((v_op->>'limit')::integer, 1) - 1) AS s);
        ELSIF v_op->>'op' IN ('renew', 'release') THEN
            v_slots[v_i + 1] := coalesce((v_op->>'slot')::integer,
                                         queen._lock_find(p_tenant, v_name, (v_op->>'token')::bigint,
                                                          CASE WHEN v_op->>'op' = 'renew' THEN v_op->>'owner' END,
                                                          v_now));
            IF v_slots[v_i + 1] IS NOT NULL THEN
                v_keys := v_keys || (v_name || '#' || v_slots[v_i + 1]);
            END IF;
        END IF;
    END LOOP;
    IF cardinality(v_keys) > 0 THEN
        PERFORM queen._kv_lock(p_tenant, array_fill('queen-locks'::text, ARRAY[cardinality(v_keys)]), v_keys);
    END IF;
    -- read the clock again after the key locks: a permit must not be granted already expired
    v_now := coalesce(p_now, clock_timestamp());

    -- 2. the ops, in order
    FOR v_i IN 0 .. v_n - 1 LOOP
        v_op := p_ops->v_i;
        v_name := v_op->>'name';
        v_result := CASE v_op->>'op'
            WHEN 'acquire' THEN queen._lock_acquire(p_tenant, v_op, v_now)
            WHEN 'renew' THEN queen._lock_renew(p_tenant, v_op, v_slots[v_i + 1], v_now)
            WHEN 'release' THEN queen._lock_release(p_tenant, v_op, v_slots[v_i + 1], v_now)
            WHEN 'get' THEN (SELECT jsonb_build_object('held', jsonb_array_length(h) > 0, 'holders', h)
                               FROM queen._lock_holders(p_tenant, v_name, v_now) AS h)
        END;
        IF v_result IS NULL THEN
            RAISE EXCEPTION 'queen.locks_v1: unknown op %', v_op->>'op';
        END IF;
        v_results := v_results || jsonb_build_array(
            jsonb_build_object('index', v_i, 'op', v_op->>'op', 'name', v_name) || v_result);
    END LOOP;
    RETURN jsonb_build_object('results', v_results);
END;
$$;
