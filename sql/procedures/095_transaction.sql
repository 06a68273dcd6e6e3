-- queen.transaction_v1: one commit for a whole worker step: acks, pushes, KV writes and timers,
-- all or nothing (docs/wire.md#transaction).
--
-- Called by: POST /api/v1/transaction (queen_pg/engine/transaction.py), which validates the body,
--          packs the pushes exactly like POST /api/v1/push and passes:
--            acks: partition id, transactionId hash and text, lease id (NULL = none), group, status,
--                  and each ack's flat index (docs/wire.md#transaction numbering);
--            p_required_leases: the bundle's requiredLeases;
--            pushes: the arguments of queen.push_v1, and each item's flat index;
--            p_kv: the validated KV ops (jsonb array), p_kv_base = flat index of p_kv[0];
--            p_timers + payloads/hashes/message ids: the validated timer ops, p_timer_base likewise;
--            p_sealed: push_v1's, per push group;
--            p_max_bytes: the answer budget (QUEEN_MAX_ANSWER_BYTES, queen_pg/engine/answers.py; NULL =
--                  none) of the KV results, as POST /api/v1/kv has it: each op may read what the ops
--                  before it left (a getMany stops there), and once the KV results pass it
--                  (queen._kv_charge, 080_kv.sql: one rule for both routes) the call is refused.
-- Result:  {"acks":[ack results], "pushes":[push results], "kv":[kv results], "timers":[timer results],
--          "wake":[queue names]}, each in input order; the broker stitches them into the flat `results`
--          list, and wakes the pops parked on the `wake` queues (queen._ack_wakes: an acked cursor row
--          left claimable, e.g. its lease released with messages left), besides the pushed queues.
-- Acks follow queen.ack_v1's offset-commit rules (docs/wire.md#ack-offset-commit): a completed ack commits the cursor
--          through its offset, a nack clamps it and releases the lease, a completed ack below the
--          cursor under its own lease (live, or released by the cursor row last) is noop=true.
-- Rollback verdicts (queen._verdict, SQLSTATE QN000: the statement aborts, nothing is written):
--          rejected_ack   an ack's transactionId is unresolvable in its partition; its lease expired or
--                         moved to another worker; a nack below the cursor ("already committed"); a
--                         completed ack below the cursor WITHOUT a lease id ("already committed":
--                         nothing proves that this worker is the one that committed it, and the
--                         bundle's pushes and KV writes must not apply twice; with its lease it is a
--                         noop and a resent bundle passes this step, its pushes decide); or a
--                         requiredLeases entry is neither live nor the last lease (released, or run
--                         out unclaimed) of a cursor row its own acks touch;
--          duplicate      a pushed transactionId is already in its partition's dedup window;
--          kv_precondition a `required` KV condition failed (failedIndex, kvReason, version, value).
--          Precedence follows the planning order: acks, then pushes, then KV, then timers.
-- Errors:  answer_too_large (queen._refuse, SQLSTATE QN001: 413 in the broker, not a verdict): the KV
--          results pass p_max_bytes; the statement aborts, so its acks, pushes, KV writes and timers
--          are all rolled back, and no later KV op is read.
--          reserved: another write holds an acked cursor row right now (SQLSTATE 55P03 from NOWAIT,
--          mapped by queen_pg/db to the `reserved` verdict): try again.
-- Locks (docs/architecture.md#lock-order, in this order): KV keys (queen._kv_lock), timer keys (queen._timer_lock),
--          queues FOR UPDATE when a push creates a partition, log_partitions FOR NO KEY UPDATE
--          (queen.push_v1), log_consumers FOR UPDATE NOWAIT ascending. Acks are pre-validated on an
--          unlocked read BEFORE the pushes so that their verdict takes precedence, then validated
--          again under the row locks. Time: p_now, or the clock read after each lock wait (after the
--          key locks for the pre-validation; push_v1 gets p_now and reads it after its own locks;
--          the ack re-validation and ack_v1 share one reading taken after the cursor rows' locks; KV
--          and timers read it after that).
-- Plans:   transaction_v1 runs with plan_cache_mode = force_generic_plan, and so does everything it
--          calls (the ack and KV/timer helpers inherit it; push_v1's core has its own): PL/pgSQL kept
--          custom plans for its array-parameter statements; measured 7-19 % less PostgreSQL CPU for a
--          1-ack + 1-push (+ 1 KV put) bundle.

CREATE OR REPLACE FUNCTION queen._tx_ack_refusal(
    p_tenant text, p_pid bigint, p_hash uuid, p_lease uuid, p_group text, p_status text, p_now timestamptz)
RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    c      queen.log_consumers%ROWTYPE;
    v_off  bigint;
    v_done boolean;
    v_nack boolean := p_status IN ('failed', 'retry');
BEGIN
    SELECT lc.* INTO c FROM queen.log_consumers lc JOIN queen.log_partitions p ON p.id = lc.partition_id
     WHERE lc.partition_id = p_pid AND lc.consumer_group = p_group AND p.tenant = p_tenant;
    IF NOT FOUND THEN
        RETURN 'no cursor for this group on the partition';
    END IF;
    SELECT t.msg_offset INTO v_off FROM queen.log_txns t  -- resolved as ack_v1 does
     WHERE t.partition_id = p_pid AND t.txn_hash = p_hash
       AND NOT EXISTS (SELECT 1 FROM queen.log_passes ps  -- never a copy this group passes over
                        WHERE ps.partition_id = p_pid AND ps.consumer_group = p_group
                          AND ps.msg_offset = t.msg_offset)
     ORDER BY (t.msg_offset < c.cursor_offset),
              CASE WHEN t.msg_offset < c.cursor_offset THEN -t.msg_offset ELSE t.msg_offset END
     LIMIT 1;
    IF NOT FOUND THEN
        RETURN format('transactionId is unresolvable in partition %s (never pushed there, or its hash is gone)',
                      p_pid);
    END IF;
    v_done := v_off < c.cursor_offset;
    IF p_lease IS NULL THEN
        RETURN CASE WHEN v_done THEN format('offset %s is already committed (the cursor is at %s)',
                                            v_off, c.cursor_offset) END;
    END IF;
    IF (c.lease_id = p_lease AND c.lease_expires_at > p_now)
       OR (v_done AND (coalesce(c.lease_id = p_lease, false) OR coalesce(c.released_lease_id = p_lease, false))) THEN
        -- its own lease: live; or, below the cursor, the row's last lease (released by its acks, or
        -- run out with nobody claiming since): a resent bundle whose answer was lost, its pushes decide
        -- (duplicate)
        IF v_done AND v_nack THEN
            RETURN format('offset %s is already committed (the cursor is at %s): a nack cannot take it back',
                          v_off, c.cursor_offset);
        END IF;
        RETURN CASE WHEN NOT v_done AND v_off >= c.lease_end THEN 'message is not part of this lease' END;
    END IF;
    RETURN CASE WHEN c.lease_id = p_lease THEN 'lease expired'
                ELSE 'lease is not held (expired or taken by another consumer)' END;
END;
$$;

-- The acks' check: queen._tx_ack_refusal of each ack in input order; the first refusal is the
-- rejected_ack verdict (queen._tx_ack_rejected). transaction_v1 runs it twice: the pre-validation on an
-- unlocked read, and again under the cursor rows' locks.
CREATE OR REPLACE FUNCTION queen._tx_acks_check(
    p_tenant text, p_pids bigint[], p_hashes uuid[], p_txns text[], p_leases uuid[], p_groups text[],
    p_statuses text[], p_index integer[], p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_reason text;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_pids), 0) LOOP
        v_reason := queen._tx_ack_refusal(p_tenant, p_pids[i], p_hashes[i], p_leases[i], p_groups[i],
                                          p_statuses[i], p_now);
        IF v_reason IS NOT NULL THEN
            PERFORM queen._tx_ack_rejected(p_index[i], p_txns[i], p_pids[i], v_reason);
        END IF;
    END LOOP;
END;
$$;

-- The rejected_ack verdict of one ack (flat index, transactionId, partition id, why).
CREATE OR REPLACE FUNCTION queen._tx_ack_rejected(p_index integer, p_txn text, p_pid bigint, p_reason text)
RETURNS void
LANGUAGE sql AS $$
    SELECT queen._verdict('rejected_ack', jsonb_build_object(
        'failedIndex', p_index, 'transactionId', p_txn, 'partitionId', p_pid::text,
        'error', format('transaction rolled back: ack of %s refused: %s', p_txn, p_reason)))
$$;

-- p_sealed and p_max_bytes come last, with defaults.
CREATE OR REPLACE FUNCTION queen.transaction_v1(
    p_tenant           text,
    p_ack_pids         bigint[],
    p_ack_hashes       uuid[],
    p_ack_txns         text[],
    p_ack_leases       uuid[],
    p_ack_groups       text[],
    p_ack_statuses     text[],
    p_ack_index        integer[],
    p_required_leases  uuid[],
    p_queues           text[],
    p_partitions       text[],
    p_blobs            bytea[],
    p_item_group       integer[],
    p_item_hash        uuid[],
    p_item_msgid       uuid[],
    p_item_index       integer[],
    p_item_txns        text[],
    p_kv               jsonb,
    p_kv_base          integer,
    p_timers           jsonb,
    p_timer_payloads   bytea[],
    p_timer_hashes     uuid[],
    p_timer_msgids     uuid[],
    p_timer_base       integer,
    p_now              timestamptz DEFAULT NULL,
    p_sealed           boolean[] DEFAULT NULL,  -- per push group: sealed (queen.push_v1)
    p_max_bytes        bigint DEFAULT NULL      -- the KV results' answer budget (NULL = none)
) RETURNS jsonb
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$  -- Plans: see the header
DECLARE
    v_now      timestamptz := coalesce(p_now, clock_timestamp());
    v_nacks    integer := coalesce(cardinality(p_ack_pids), 0);
    v_nitems   integer := coalesce(cardinality(p_item_group), 0);
    v_lease    uuid;
    v_acks     jsonb := '[]'::jsonb;
    v_pushes   jsonb := '[]'::jsonb;
    v_kv       jsonb := '[]'::jsonb;
    v_timers   jsonb := '[]'::jsonb;
    v_wake     text[] := '{}';
    v_used     bigint := 0;
    v_res      jsonb;
    v_op       jsonb;
    r          record;
    i          integer;
BEGIN
    -- 0. key locks first (docs/architecture.md#lock-order): KV keys, then timer keys
    IF jsonb_array_length(coalesce(p_kv, '[]')) > 0 THEN
        PERFORM queen._kv_lock(p_tenant, array_agg(k.ns), array_agg(k.key))
           FROM (SELECT o ->> 'ns' AS ns, o ->> 'key' AS key FROM jsonb_array_elements(p_kv) AS o
                  WHERE o ? 'key'
                 UNION ALL
                 SELECT o ->> 'ns', m FROM jsonb_array_elements(p_kv) AS o,
                        jsonb_array_elements_text(coalesce(o -> 'keys', '[]')) AS m) AS k;
    END IF;
    IF jsonb_array_length(coalesce(p_timers, '[]')) > 0 THEN
        PERFORM queen._timer_lock(p_tenant, array_agg(o ->> 'queue'), array_agg(o ->> 'timerKey'))
           FROM jsonb_array_elements(p_timers) AS o;
    END IF;
    v_now := coalesce(p_now, clock_timestamp());  -- after the key locks: leases are judged at this time

    -- 1. acks and required leases, pre-validated (planning order: their verdict comes first)
    PERFORM queen._tx_acks_check(p_tenant, p_ack_pids, p_ack_hashes, p_ack_txns, p_ack_leases, p_ack_groups,
                                 p_ack_statuses, p_ack_index, v_now);
    FOREACH v_lease IN ARRAY coalesce(p_required_leases, '{}') LOOP
        -- live anywhere (its cursor rows through queen.log_leases), or the last lease of a row its own
        -- acks touch: released by them, or run out with nobody claiming since. The acks were checked
        -- above under the same rule (queen._tx_ack_refusal): under a lease that ran out only offsets
        -- already below the cursor pass, i.e. a resent bundle whose answer was lost; its pushes decide.
        IF NOT EXISTS (SELECT 1 FROM queen.log_leases l
                         JOIN queen.log_consumers lc
                           ON lc.partition_id = l.partition_id AND lc.consumer_group = l.consumer_group
                        WHERE l.lease_id = v_lease AND lc.lease_id = v_lease
                          AND lc.lease_expires_at > v_now AND lc.tenant = p_tenant)
           AND NOT EXISTS (SELECT 1 FROM queen.log_consumers lc
                            WHERE lc.partition_id = ANY (coalesce(p_ack_pids, '{}'))
                              AND (lc.released_lease_id = v_lease OR lc.lease_id = v_lease)
                              AND lc.tenant = p_tenant) THEN
            PERFORM queen._verdict('rejected_ack', jsonb_build_object(
                'leaseId', v_lease::text,
                'error', format('transaction rolled back: required lease %s is not held', v_lease)));
        END IF;
    END LOOP;

    -- 2. pushes (queues, partitions: their locks and creation happen inside push_v1)
    IF v_nitems > 0 THEN
        SELECT jsonb_agg(jsonb_build_object('idx', p.idx, 'status', p.status, 'messageId', p.message_id,
                                            'partitionId', p.partition_id::text, 'offset', p.msg_offset)
                         ORDER BY p.idx)
          INTO v_pushes
          FROM queen.push_v1(p_tenant, p_queues, p_partitions, p_blobs, p_item_group, p_item_hash,
                             p_item_msgid, p_now, NULL, p_sealed) AS p;  -- push_v1 reads the clock after its locks
        SELECT e.ord::integer AS ord, e.v INTO r
          FROM jsonb_array_elements(v_pushes) WITH ORDINALITY AS e(v, ord)
         WHERE e.v ->> 'status' = 'duplicate' ORDER BY e.ord LIMIT 1;
        IF FOUND THEN
            PERFORM queen._verdict('duplicate', jsonb_build_object(
                'failedIndex', p_item_index[r.ord], 'transactionId', p_item_txns[r.ord],
                'messageId', r.v ->> 'messageId',
                'error', format('transaction rolled back: push %s is a duplicate (the step already committed)',
                                p_item_txns[r.ord])));
        END IF;
    END IF;

    -- 3. acks under the cursor rows' locks (NOWAIT: a busy cursor is the `reserved` verdict)
    IF v_nacks > 0 THEN
        PERFORM 1 FROM queen.log_consumers lc
          JOIN (SELECT DISTINCT u.pid, u.grp FROM unnest(p_ack_pids, p_ack_groups) AS u(pid, grp)) k
            ON lc.partition_id = k.pid AND lc.consumer_group = k.grp
         ORDER BY lc.partition_id, lc.consumer_group
           FOR UPDATE OF lc NOWAIT;
        v_now := coalesce(p_now, clock_timestamp());  -- after the last lock wait (push_v1's partitions)
        PERFORM queen._tx_acks_check(p_tenant, p_ack_pids, p_ack_hashes, p_ack_txns, p_ack_leases, p_ack_groups,
                                     p_ack_statuses, p_ack_index, v_now);
        SELECT jsonb_agg(jsonb_build_object('success', a.success, 'error', a.error,
                                            'leaseReleased', a.lease_released, 'dlq', a.dlq, 'noop', a.noop)
                         ORDER BY a.idx)
          INTO v_acks
          FROM queen.ack_v1(p_tenant, p_ack_pids, p_ack_hashes, p_ack_txns, p_ack_leases, p_ack_groups,
                            p_ack_statuses, array_fill(NULL::text, ARRAY[v_nacks]), v_now) AS a;
        -- v_now: read after the cursor rows' locks (the last wait; ack_v1 takes them again without
        -- waiting), the time the re-validation above judged the leases at: one verdict, one time
        -- A safety net: an ack that ack_v1 refused never commits beside the bundle's other effects.
        SELECT e.ord::integer AS ord, e.v INTO r
          FROM jsonb_array_elements(v_acks) WITH ORDINALITY AS e(v, ord)
         WHERE NOT (e.v ->> 'success')::boolean ORDER BY e.ord LIMIT 1;
        IF FOUND THEN
            PERFORM queen._tx_ack_rejected(p_ack_index[r.ord], p_ack_txns[r.ord], p_ack_pids[r.ord], r.v ->> 'error');
        END IF;
        -- the queues whose acked cursor rows are claimable now (a released lease, a nack): woken
        v_wake := queen._ack_wakes(p_tenant, p_ack_pids, p_ack_groups, v_now);
    END IF;
    v_now := coalesce(p_now, clock_timestamp());  -- for KV and timers: after every lock wait

    -- 4. KV, in order; a lost `required` condition rolls everything back, and so does an answer past
    --    the budget (each op reads at most what the ops before it left)
    FOR v_op, i IN SELECT e.v, e.ord::integer FROM jsonb_array_elements(coalesce(p_kv, '[]')) WITH ORDINALITY AS e(v, ord)
    LOOP
        v_res := queen._kv_apply(p_tenant, v_op, v_now, p_max_bytes - v_used);
        IF coalesce((v_res ->> '_lost')::boolean, false) AND coalesce((v_op ->> 'required')::boolean, false) THEN
            PERFORM queen._verdict('kv_precondition', jsonb_build_object(
                'failedIndex', p_kv_base + i - 1, 'kvReason', v_res ->> 'reason',
                'version', coalesce(v_res -> 'version', '0'::jsonb), 'value', v_res -> 'value',
                'error', format('transaction rolled back: KV condition on %s/%s failed (%s)',
                                v_op ->> 'ns', v_op ->> 'key', v_res ->> 'reason')));
        END IF;
        v_res := (v_res - '_lost') || jsonb_build_object('index', p_kv_base + i - 1);
        v_used := queen._kv_charge(v_used, v_op, v_res, p_max_bytes, 'kv', i - 1);
        v_kv := v_kv || jsonb_build_array(v_res);
    END LOOP;

    -- 5. timers
    FOR v_op, i IN SELECT e.v, e.ord::integer FROM jsonb_array_elements(coalesce(p_timers, '[]')) WITH ORDINALITY AS e(v, ord)
    LOOP
        v_res := queen._timer_apply(p_tenant, v_op, p_timer_payloads[i], p_timer_hashes[i], p_timer_msgids[i], v_now);
        v_timers := v_timers || jsonb_build_array(v_res || jsonb_build_object('index', p_timer_base + i - 1));
    END LOOP;

    RETURN jsonb_build_object('acks', coalesce(v_acks, '[]'::jsonb), 'pushes', coalesce(v_pushes, '[]'::jsonb),
                              'kv', v_kv, 'timers', v_timers, 'wake', to_jsonb(v_wake));
END;
$$;
