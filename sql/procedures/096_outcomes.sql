-- The outcome window: a request carrying Idempotency-Key (or X-Request-Id) that was already answered
-- within QUEEN_REQUEST_ID_WINDOW_S gets the recorded outcome again instead of being applied twice, on
-- any replica (the design). Table: queen.request_outcomes (sql/schema.sql).
--
-- Called by: the engine (queen_pg/engine/outcomes.py and the modules below) for a request WITH a key;
--          a request without one calls the procedure it wraps (push_v3 and ack_v3 for the packed
--          forms of push and ack) directly, unchanged:
--            queen.push_v2        POST /api/v1/push                 (wraps queen.push_v1)
--            queen.ack_v2         POST /api/v1/ack, /ack/batch      (wraps queen.ack_v1)
--            queen.transaction_v2 POST /api/v1/transaction          (wraps queen.transaction_v1; its
--                                 p_sealed and p_max_bytes last, as transaction_v1 has them)
--            queen.kv_v3          POST /api/v1/kv, every request    (wraps queen._kv_run, with the
--                                 answer budget p_max_bytes after p_now; key NULL = no key)
--            queen.locks_v2       POST /api/v1/locks                (wraps queen.locks_v1)
--          Each takes the _v1 arguments (p_now included), then p_request_key, p_route (the route's
--          name), p_body_hash (xxh3-128 of the request body) and p_window_s. With p_request_key NULL
--          it is exactly its _v1.
-- Result:  the _v1 result plus `replayed`: rows (push, ack) with a `replayed` column, or one row
--          (result jsonb, replayed boolean) for the jsonb procedures. replayed = true: nothing was
--          applied, `result` is the recorded one.
-- Why _v2 wrappers: the signature the routes call changed, and a changed signature ships as _v2
--          (STYLE). The _v1 procedures keep their signatures and bodies, because the _v2 wrap them and
--          transaction_v1 calls push_v1 and ack_v1 itself; so nothing has to be dropped later.
-- Locks:   (docs/architecture.md#lock-order, level -1, before every other lock) the request key,
--          pg_advisory_xact_lock(REQUEST_KEY_CLASS = 77814, hashtext(tenant || E'\x1f' || key)),
--          held until commit: concurrent duplicates serialize on it, so exactly one applies and the
--          others then find its record. Then whatever the wrapped _v1 takes, in its order.
-- Guarantees: the record is written in the same transaction as the effect, so there is no window in
--          which the effect committed without its record (or the reverse). A verdict (QN000) or any
--          error aborts the statement: nothing is applied and nothing recorded; a retry decides anew.
--          A live record (expires_at > now) is replayed only for the same route and body hash.
-- Errors:  queen._refuse('idempotency_key_reused', ...) (SQLSTATE QN001, 422 in the broker): the key
--          names a live record of another route or body.
--
-- queen.outcomes_prune_v1(limit, now) -> integer
--   Called by: the outcomes_prune job (queen_pg/jobs/outcomes.py). Deletes at most `limit` records past
--   their expires_at, oldest first (queen._expired_sweep, 001_internal.sql). Locks: OUTCOMES_PRUNE_LOCK (try; losers return 0 at once), then
--   the rows FOR UPDATE SKIP LOCKED, re-checking the expiry. It takes no key locks: a dead record is
--   never replayed, so deleting it changes no answer (a writer that replaces one upserts it).

-- A refusal from the error catalog (queen_pg/errors.py): SQLSTATE QN001, MESSAGE = the catalog code,
-- DETAIL = the message; queen_pg/db maps it to QueenError(CATALOG[code]).
CREATE OR REPLACE FUNCTION queen._refuse(p_code text, p_detail text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'QN001', MESSAGE = p_code, DETAIL = p_detail;
END;
$$;

-- The one rule of every wrapper below, stated once: find the key's live record (the key's lock first);
-- on a miss (or without a key) apply the wrapped procedure, then record its answer under the key. Each
-- wrapper is one statement: _outcome_open, the apply inside coalesce(o.replay, _outcome_keep(...)), so it
-- runs only on a miss (COALESCE evaluates an argument only when the ones before it are NULL).

-- Takes the key's lock; `replay`: the live record's response (NULL = none, or no key: apply, then
-- _outcome_keep); `judged_at`: the time the record is judged and written at.
CREATE OR REPLACE FUNCTION queen._outcome_open(
    p_tenant text, p_key text, p_route text, p_body_hash uuid, p_now timestamptz,
    OUT replay jsonb, OUT judged_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    r queen.request_outcomes%ROWTYPE;
BEGIN
    judged_at := coalesce(p_now, clock_timestamp());
    IF p_key IS NULL THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(77814, hashtext(p_tenant || E'\x1f' || p_key));  -- REQUEST_KEY_CLASS
    SELECT o.* INTO r FROM queen.request_outcomes o
     WHERE o.tenant = p_tenant AND o.request_key = p_key AND o.expires_at > judged_at;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF r.route <> p_route OR r.body_hash <> p_body_hash THEN
        PERFORM queen._refuse('idempotency_key_reused', format(
            'the request key %s already answered another request (%s) at %s; a retry must send the same '
            'body to the same route, and a new request a new key', p_key, r.route, queen._iso_utc(r.created_at)));
    END IF;
    replay := r.response;
END;
$$;

-- Records p_response under the key (no key: records nothing) and returns it.
CREATE OR REPLACE FUNCTION queen._outcome_keep(
    p_response jsonb, p_at timestamptz, p_tenant text, p_key text, p_route text, p_body_hash uuid,
    p_window_s integer)
RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    IF p_key IS NOT NULL THEN
        INSERT INTO queen.request_outcomes AS o (tenant, request_key, route, body_hash, response, created_at,
                                                 expires_at)
        VALUES (p_tenant, p_key, p_route, p_body_hash, p_response, p_at,
                p_at + make_interval(secs => greatest(p_window_s, 1)))
        ON CONFLICT ON CONSTRAINT request_outcomes_pkey DO UPDATE   -- only a dead record: we hold the key
           SET route = excluded.route, body_hash = excluded.body_hash, response = excluded.response,
               created_at = excluded.created_at, expires_at = excluded.expires_at;
    END IF;
    RETURN p_response;
END;
$$;

-- The row procedures: their rows are recorded as a jsonb array and answered from it.
-- p_sealed (last, with a default) is push_v1's.
CREATE OR REPLACE FUNCTION queen.push_v2(
    p_tenant text, p_queues text[], p_partitions text[], p_blobs bytea[], p_item_group integer[],
    p_item_hash uuid[], p_item_msgid uuid[], p_now timestamptz DEFAULT NULL,
    p_request_key text DEFAULT NULL, p_route text DEFAULT 'push', p_body_hash uuid DEFAULT NULL,
    p_window_s integer DEFAULT 60, p_sealed boolean[] DEFAULT NULL
) RETURNS TABLE (idx integer, status text, message_id uuid, partition_id bigint, msg_offset bigint,
                 replayed boolean)
LANGUAGE sql AS $$
    SELECT r.idx, r.status, r.message_id, r.partition_id, r.msg_offset, o.replay IS NOT NULL
      FROM queen._outcome_open(p_tenant, p_request_key, p_route, p_body_hash, p_now) AS o,
           jsonb_to_recordset(coalesce(o.replay, queen._outcome_keep(
               (SELECT coalesce(jsonb_agg(to_jsonb(p) ORDER BY p.idx), '[]')
                  FROM queen.push_v1(p_tenant, p_queues, p_partitions, p_blobs, p_item_group, p_item_hash,
                                     p_item_msgid, p_now, NULL, p_sealed) AS p), o.judged_at,
               p_tenant, p_request_key, p_route, p_body_hash, p_window_s)))
             AS r(idx integer, status text, message_id uuid, partition_id bigint, msg_offset bigint)
     ORDER BY r.idx
$$;

CREATE OR REPLACE FUNCTION queen.ack_v2(
    p_tenant text, p_partition_ids bigint[], p_hashes uuid[], p_txn_ids text[], p_lease_ids uuid[],
    p_groups text[], p_statuses text[], p_errors text[], p_now timestamptz DEFAULT NULL,
    p_request_key text DEFAULT NULL, p_route text DEFAULT 'ack', p_body_hash uuid DEFAULT NULL,
    p_window_s integer DEFAULT 60
) RETURNS TABLE (idx integer, success boolean, error text, lease_released boolean, dlq boolean, noop boolean,
                 replayed boolean)
LANGUAGE sql AS $$
    SELECT r.idx, r.success, r.error, r.lease_released, r.dlq, r.noop, o.replay IS NOT NULL
      FROM queen._outcome_open(p_tenant, p_request_key, p_route, p_body_hash, p_now) AS o,
           jsonb_to_recordset(coalesce(o.replay, queen._outcome_keep(
               (SELECT coalesce(jsonb_agg(to_jsonb(a) ORDER BY a.idx), '[]')
                  FROM queen.ack_v1(p_tenant, p_partition_ids, p_hashes, p_txn_ids, p_lease_ids, p_groups,
                                    p_statuses, p_errors, p_now) AS a), o.judged_at,
               p_tenant, p_request_key, p_route, p_body_hash, p_window_s)))
             AS r(idx integer, success boolean, error text, lease_released boolean, dlq boolean, noop boolean)
     ORDER BY r.idx
$$;

-- The jsonb procedures: one row (result, replayed).
CREATE OR REPLACE FUNCTION queen.kv_v3(
    p_tenant text, p_ops jsonb, p_now timestamptz, p_max_bytes bigint,
    p_request_key text DEFAULT NULL, p_route text DEFAULT 'kv', p_body_hash uuid DEFAULT NULL,
    p_window_s integer DEFAULT 60
) RETURNS TABLE (result jsonb, replayed boolean)
LANGUAGE sql AS $$
    SELECT coalesce(o.replay, queen._outcome_keep(queen._kv_run(p_tenant, p_ops, p_now, p_max_bytes), o.judged_at,
                                                  p_tenant, p_request_key, p_route, p_body_hash, p_window_s)),
           o.replay IS NOT NULL
      FROM queen._outcome_open(p_tenant, p_request_key, p_route, p_body_hash, p_now) AS o
$$;

CREATE OR REPLACE FUNCTION queen.locks_v2(
    p_tenant text, p_ops jsonb, p_now timestamptz DEFAULT NULL,
    p_request_key text DEFAULT NULL, p_route text DEFAULT 'locks', p_body_hash uuid DEFAULT NULL,
    p_window_s integer DEFAULT 60
) RETURNS TABLE (result jsonb, replayed boolean)
LANGUAGE sql AS $$
    SELECT coalesce(o.replay, queen._outcome_keep(queen.locks_v1(p_tenant, p_ops, p_now), o.judged_at,
                                                  p_tenant, p_request_key, p_route, p_body_hash, p_window_s)),
           o.replay IS NOT NULL
      FROM queen._outcome_open(p_tenant, p_request_key, p_route, p_body_hash, p_now) AS o
$$;

-- p_transaction_id: the id the broker minted for this answer; it is recorded inside the result
-- ({"transactionId": ...}), so a replay answers the same id.
CREATE OR REPLACE FUNCTION queen.transaction_v2(
    p_tenant text, p_ack_pids bigint[], p_ack_hashes uuid[], p_ack_txns text[], p_ack_leases uuid[],
    p_ack_groups text[], p_ack_statuses text[], p_ack_index integer[], p_required_leases uuid[],
    p_queues text[], p_partitions text[], p_blobs bytea[], p_item_group integer[], p_item_hash uuid[],
    p_item_msgid uuid[], p_item_index integer[], p_item_txns text[], p_kv jsonb, p_kv_base integer,
    p_timers jsonb, p_timer_payloads bytea[], p_timer_hashes uuid[], p_timer_msgids uuid[], p_timer_base integer,
    p_now timestamptz DEFAULT NULL,
    p_request_key text DEFAULT NULL, p_route text DEFAULT 'transaction', p_body_hash uuid DEFAULT NULL,
    p_window_s integer DEFAULT 60, p_transaction_id text DEFAULT NULL, p_sealed boolean[] DEFAULT NULL,
    p_max_bytes bigint DEFAULT NULL
) RETURNS TABLE (result jsonb, replayed boolean)
LANGUAGE sql AS $$
    SELECT coalesce(o.replay, queen._outcome_keep(
               queen.transaction_v1(p_tenant, p_ack_pids, p_ack_hashes, p_ack_txns, p_ack_leases, p_ack_groups,
                                    p_ack_statuses, p_ack_index, p_required_leases, p_queues, p_partitions,
                                    p_blobs, p_item_group, p_item_hash, p_item_msgid, p_item_index,
                                    p_item_txns, p_kv, p_kv_base, p_timers, p_timer_payloads, p_timer_hashes,
                                    p_timer_msgids, p_timer_base, p_now, p_sealed, p_max_bytes)
               || jsonb_build_object('transactionId', p_transaction_id), o.judged_at,
               p_tenant, p_request_key, p_route, p_body_hash, p_window_s)),
           o.replay IS NOT NULL
      FROM queen._outcome_open(p_tenant, p_request_key, p_route, p_body_hash, p_now) AS o
$$;

CREATE OR REPLACE FUNCTION queen.outcomes_prune_v1(p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE sql AS $$
    SELECT queen._expired_sweep(7781200196, 'queen.request_outcomes', '{tenant, request_key}',  -- OUTCOMES_PRUNE_LOCK
                                p_limit, p_now)
$$;
