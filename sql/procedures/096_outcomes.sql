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
--   their expires_at, oldest first. Locks: OUTCOMES_PRUNE_LOCK (try; losers return 0 at once), then
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

-- Takes the key's lock; the live record's response (NULL = none: apply, then _outcome_record).
CREATE OR REPLACE FUNCTION queen._outcome_find(
    p_tenant text, p_key text, p_route text, p_body_hash uuid, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    r queen.request_outcomes%ROWTYPE;
BEGIN
    PERFORM pg_advisory_xact_lock(77814, hashtext(p_tenant || E'\x1f' || p_key));  -- REQUEST_KEY_CLASS
    SELECT o.* INTO r FROM queen.request_outcomes o
     WHERE o.tenant = p_tenant AND o.request_key = p_key AND o.expires_at > p_now;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF r.route <> p_route OR r.body_hash <> p_body_hash THEN
        PERFORM queen._refuse('idempotency_key_reused', format(
            'the request key %s already answered another request (%s) at %s; a retry must send the same '
            'body to the same route, and a new request a new key', p_key, r.route, queen._iso_utc(r.created_at)));
    END IF;
    RETURN r.response;
END;
$$;

CREATE OR REPLACE FUNCTION queen._outcome_record(
    p_tenant text, p_key text, p_route text, p_body_hash uuid, p_response jsonb, p_window_s integer,
    p_now timestamptz)
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO queen.request_outcomes AS o (tenant, request_key, route, body_hash, response, created_at, expires_at)
    VALUES (p_tenant, p_key, p_route, p_body_hash, p_response, p_now,
            p_now + make_interval(secs => greatest(p_window_s, 1)))
    ON CONFLICT ON CONSTRAINT request_outcomes_pkey DO UPDATE   -- only a dead record: we hold the key
       SET route = excluded.route, body_hash = excluded.body_hash, response = excluded.response,
           created_at = excluded.created_at, expires_at = excluded.expires_at;
$$;

-- p_sealed (last, with a default) is push_v1's.
CREATE OR REPLACE FUNCTION queen.push_v2(
    p_tenant text, p_queues text[], p_partitions text[], p_blobs bytea[], p_item_group integer[],
    p_item_hash uuid[], p_item_msgid uuid[], p_now timestamptz DEFAULT NULL,
    p_request_key text DEFAULT NULL, p_route text DEFAULT 'push', p_body_hash uuid DEFAULT NULL,
    p_window_s integer DEFAULT 60, p_sealed boolean[] DEFAULT NULL
) RETURNS TABLE (idx integer, status text, message_id uuid, partition_id bigint, msg_offset bigint,
                 replayed boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := coalesce(p_now, clock_timestamp());
    v_rows  jsonb;
BEGIN
    IF p_request_key IS NOT NULL THEN
        v_rows := queen._outcome_find(p_tenant, p_request_key, p_route, p_body_hash, v_now);
    END IF;
    IF v_rows IS NULL THEN
        SELECT coalesce(jsonb_agg(to_jsonb(p) ORDER BY p.idx), '[]') INTO v_rows
          FROM queen.push_v1(p_tenant, p_queues, p_partitions, p_blobs, p_item_group, p_item_hash,
                             p_item_msgid, p_now, NULL, p_sealed) AS p;
        IF p_request_key IS NOT NULL THEN
            PERFORM queen._outcome_record(p_tenant, p_request_key, p_route, p_body_hash, v_rows, p_window_s, v_now);
        END IF;
        replayed := false;
    ELSE
        replayed := true;
    END IF;
    RETURN QUERY
    SELECT r.idx, r.status, r.message_id, r.partition_id, r.msg_offset, replayed
      FROM jsonb_to_recordset(v_rows) AS r(idx integer, status text, message_id uuid, partition_id bigint,
                                           msg_offset bigint)
     ORDER BY r.idx;
END;
$$;

CREATE OR REPLACE FUNCTION queen.ack_v2(
    p_tenant text, p_partition_ids bigint[], p_hashes uuid[], p_txn_ids text[], p_lease_ids uuid[],
    p_groups text[], p_statuses text[], p_errors text[], p_now timestamptz DEFAULT NULL,
    p_request_key text DEFAULT NULL, p_route text DEFAULT 'ack', p_body_hash uuid DEFAULT NULL,
    p_window_s integer DEFAULT 60
) RETURNS TABLE (idx integer, success boolean, error text, lease_released boolean, dlq boolean, noop boolean,
                 replayed boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := coalesce(p_now, clock_timestamp());
    v_rows  jsonb;
BEGIN
    IF p_request_key IS NOT NULL THEN
        v_rows := queen._outcome_find(p_tenant, p_request_key, p_route, p_body_hash, v_now);
    END IF;
    IF v_rows IS NULL THEN
        SELECT coalesce(jsonb_agg(to_jsonb(a) ORDER BY a.idx), '[]') INTO v_rows
          FROM queen.ack_v1(p_tenant, p_partition_ids, p_hashes, p_txn_ids, p_lease_ids, p_groups, p_statuses,
                            p_errors, p_now) AS a;
        IF p_request_key IS NOT NULL THEN
            PERFORM queen._outcome_record(p_tenant, p_request_key, p_route, p_body_hash, v_rows, p_window_s, v_now);
        END IF;
        replayed := false;
    ELSE
        replayed := true;
    END IF;
    RETURN QUERY
    SELECT r.idx, r.success, r.error, r.lease_released, r.dlq, r.noop, replayed
      FROM jsonb_to_recordset(v_rows) AS r(idx integer, success boolean, error text, lease_released boolean,
                                           dlq boolean, noop boolean)
     ORDER BY r.idx;
END;
$$;

-- The jsonb procedures: one row (result, replayed).
CREATE OR REPLACE FUNCTION queen.kv_v3(
    p_tenant text, p_ops jsonb, p_now timestamptz, p_max_bytes bigint,
    p_request_key text DEFAULT NULL, p_route text DEFAULT 'kv', p_body_hash uuid DEFAULT NULL,
    p_window_s integer DEFAULT 60
) RETURNS TABLE (result jsonb, replayed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    IF p_request_key IS NOT NULL THEN
        result := queen._outcome_find(p_tenant, p_request_key, p_route, p_body_hash, v_now);
    END IF;
    replayed := result IS NOT NULL;
    IF NOT replayed THEN
        result := queen._kv_run(p_tenant, p_ops, p_now, p_max_bytes);
        IF p_request_key IS NOT NULL THEN
            PERFORM queen._outcome_record(p_tenant, p_request_key, p_route, p_body_hash, result, p_window_s, v_now);
        END IF;
    END IF;
    RETURN NEXT;
END;
$$;

CREATE OR REPLACE FUNCTION queen.locks_v2(
    p_tenant text, p_ops jsonb, p_now timestamptz DEFAULT NULL,
    p_request_key text DEFAULT NULL, p_route text DEFAULT 'locks', p_body_hash uuid DEFAULT NULL,
    p_window_s integer DEFAULT 60
) RETURNS TABLE (result jsonb, replayed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    IF p_request_key IS NOT NULL THEN
        result := queen._outcome_find(p_tenant, p_request_key, p_route, p_body_hash, v_now);
    END IF;
    replayed := result IS NOT NULL;
    IF NOT replayed THEN
        result := queen.locks_v1(p_tenant, p_ops, p_now);
        IF p_request_key IS NOT NULL THEN
            PERFORM queen._outcome_record(p_tenant, p_request_key, p_route, p_body_hash, result, p_window_s, v_now);
        END IF;
    END IF;
    RETURN NEXT;
END;
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
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    IF p_request_key IS NOT NULL THEN
        result := queen._outcome_find(p_tenant, p_request_key, p_route, p_body_hash, v_now);
    END IF;
    replayed := result IS NOT NULL;
    IF NOT replayed THEN
        result := queen.transaction_v1(p_tenant, p_ack_pids, p_ack_hashes, p_ack_txns, p_ack_leases, p_ack_groups,
                                       p_ack_statuses, p_ack_index, p_required_leases, p_queues, p_partitions,
                                       p_blobs, p_item_group, p_item_hash, p_item_msgid, p_item_index,
                                       p_item_txns, p_kv, p_kv_base, p_timers, p_timer_payloads, p_timer_hashes,
                                       p_timer_msgids, p_timer_base, p_now, p_sealed, p_max_bytes)
                  || jsonb_build_object('transactionId', p_transaction_id);
        IF p_request_key IS NOT NULL THEN
            PERFORM queen._outcome_record(p_tenant, p_request_key, p_route, p_body_hash, result, p_window_s, v_now);
        END IF;
    END IF;
    RETURN NEXT;
END;
$$;

CREATE OR REPLACE FUNCTION queen.outcomes_prune_v1(p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_deleted integer;
BEGIN
    IF NOT pg_try_advisory_xact_lock(7781200196) THEN  -- OUTCOMES_PRUNE_LOCK
        RETURN 0;
    END IF;
    WITH doomed AS (
        SELECT o.tenant, o.request_key
          FROM queen.request_outcomes o
         WHERE o.expires_at <= v_now
         ORDER BY o.expires_at
         LIMIT greatest(p_limit, 1)
           FOR UPDATE SKIP LOCKED
    )
    DELETE FROM queen.request_outcomes o
     USING doomed d
     WHERE o.tenant = d.tenant AND o.request_key = d.request_key AND o.expires_at <= v_now;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END;
$$;
