-- queen.push_v1 / queen.push_v3: append messages to partitions, deduplicated by transactionId hash.
--
-- Called by: POST /api/v1/push (queen_pg/engine/push.py: push_v3), push_v2 (a request key),
--          transaction_v1 and the timer job (push_v1).
-- Inputs:  one entry per GROUP (a distinct queue+partition of the request, in first-seen order):
--            p_queues[g], p_partitions[g], p_blobs[g] = zstd of every item's QPF1 frame, in item order
--            (or the raw frames when p_codecs[g] = 0: SQL callers such as the timer job write raw);
--          one entry per ITEM, in request order:
--            p_item_group[i] (1-based group), p_item_hash[i] (xxh3-128 of the transactionId, as uuid),
--            p_item_msgid[i] (message id minted by the broker);
--          p_sealed[g]: whether group g's payloads are sealed (queen_pg/security/crypto.py). NULL (the
--            whole array) = every group plain; a NULL element = not checked (the timer job, whose
--            frames say it themselves: queen._frame). The group's segment row keeps it as `sealed`
--            (false for a plain group, true for a sealed one or a NULL element), so a framed pop
--            decodes only segments that may hold sealed frames (queen_pg/engine/pop.py).
-- Result:  one row per item, in request order: (idx 1-based, status 'queued'|'duplicate', message_id,
--          partition_id, msg_offset). A duplicate carries the ORIGINAL message id and offset.
-- Locks:   (docs/architecture.md#lock-order) queues FOR UPDATE only when a partition is created (via
--          queen._create_partitions); then log_partitions FOR NO KEY UPDATE in ascending id order;
--          then, after the append, the caught-up log_consumers rows of those partitions FOR NO KEY
--          UPDATE ascending (partition_id, group) to mark them pending (queen._wake_cursors).
-- Guarantees: a missing queue or partition is created in the same transaction as its first message;
--          offsets per partition are gapless; an item whose hash is already in its partition inside the
--          queue's dedup window, or repeats an earlier item of this call, is a duplicate and adds
--          nothing; survivors of one group form one segment row. created_at is stamped under the
--          partition lock and never goes backwards within a partition. A call of one item per group
--          (item i in group i: fused 1-item pushes to several partitions) decides and writes in one
--          statement (steps 4-5 of queen._push_core), with the same locks, answers and rows.
--          A group whose sealing disagrees with its queue's encryption_enabled, read after the
--          partition locks (configure takes them when it turns encryption on: a push that committed
--          plaintext committed before the switch), writes nothing.
-- Errors:  encryption_mismatch (queen._refuse; DETAIL = {"queue": encrypted, ...} of every group): the
--          broker learns it and calls again, sealed as told. A queue deleted concurrently surfaces as a
--          foreign-key violation (mapped to 503 retry by queen_pg/db).

-- queen._push_core: the whole append (steps 1-6 below); push_v1 and push_v3 only shape its answer.
CREATE OR REPLACE FUNCTION queen._push_core(
    p_tenant      text,
    p_queues      text[],
    p_partitions  text[],
    p_blobs       bytea[],
    p_item_group  integer[],
    p_item_hash   uuid[],
    p_item_msgid  uuid[],
    p_now         timestamptz DEFAULT NULL,
    p_codecs      smallint[] DEFAULT NULL,
    p_sealed      boolean[] DEFAULT NULL,
    OUT v_gp      bigint[],   -- partition id per group
    OUT v_next    bigint[],   -- per group: the offset its first stored item got (next_offset under the lock)
    OUT r_live    boolean[],  -- per item: stored (else a duplicate)
    OUT r_msgid   uuid[],     -- per item: its message id, or the original's for a duplicate
    OUT r_off     bigint[]    -- per item: its offset, or the original's for a duplicate
)
-- Generic plans: with array parameters PL/pgSQL's plan cache kept choosing custom plans, i.e. planned
-- every statement on every call (~40 % of a 1-item push's PostgreSQL CPU); the generic plans of these
-- statements are the same shapes (index lookups by key, hash/sort over the arrays) at every batch size.
-- No sequential scans: a connection keeps its generic plans, and plans made while autovacuum's
-- statistics said "a few rows" (its first ANALYZE of log_txns comes early) read log_txns whole once
-- per pushed item until the next ANALYZE, as the table grew (~257 instead of ~13 us of PostgreSQL CPU
-- per message at 150,000 rows; tests/test_push_plans.py). Every statement here reads by key.
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
DECLARE
    v_gq      bigint[];       -- queue id per group
    v_win     integer[];      -- dedup window per group (seconds)
    v_ts      timestamptz[];  -- created_at per group
    v_enc     boolean[];      -- queues.encryption_enabled per group (under the partition lock)
    v_now     timestamptz;
    v_one     boolean;        -- every group holds one item, item i in group i (fused 1-item pushes)
    w_pid     bigint[];       -- that path: the partitions that got a message, and its created_at
    w_ts      timestamptz[];
BEGIN
    -- 1. queues, created when missing
    SELECT array_agg(q.id ORDER BY g.ord) INTO v_gq
      FROM unnest(p_queues) WITH ORDINALITY AS g(name, ord)
      LEFT JOIN queen.queues q ON q.tenant = p_tenant AND q.name = g.name;
    IF array_position(v_gq, NULL) IS NOT NULL THEN
        INSERT INTO queen.queues (tenant, name)
        SELECT DISTINCT p_tenant, g.name FROM unnest(p_queues) AS g(name)
         WHERE NOT EXISTS (SELECT 1 FROM queen.queues q WHERE q.tenant = p_tenant AND q.name = g.name)
         ORDER BY 2
        ON CONFLICT (tenant, name) DO NOTHING;
        SELECT array_agg(q.id ORDER BY g.ord) INTO v_gq
          FROM unnest(p_queues) WITH ORDINALITY AS g(name, ord)
          JOIN queen.queues q ON q.tenant = p_tenant AND q.name = g.name;
    END IF;

    -- 2. partitions, created when missing
    SELECT array_agg(p.id ORDER BY g.ord) INTO v_gp
      FROM unnest(v_gq, p_partitions) WITH ORDINALITY AS g(qid, name, ord)
      LEFT JOIN queen.log_partitions p ON p.queue_id = g.qid AND p.name = g.name;
    IF array_position(v_gp, NULL) IS NOT NULL THEN
        PERFORM queen._create_partitions(p_tenant, v_gq, p_partitions);
        SELECT array_agg(p.id ORDER BY g.ord) INTO v_gp
          FROM unnest(v_gq, p_partitions) WITH ORDINALITY AS g(qid, name, ord)
          JOIN queen.log_partitions p ON p.queue_id = g.qid AND p.name = g.name;
    END IF;

    -- 3. the partitions' write locks, ascending id
    PERFORM 1 FROM queen.log_partitions p WHERE p.id = ANY (v_gp) ORDER BY p.id FOR NO KEY UPDATE;
    v_now := coalesce(p_now, clock_timestamp());
    SELECT array_agg(p.next_offset ORDER BY g.ord),
           array_agg(q.dedup_window_seconds ORDER BY g.ord),
           array_agg(greatest(v_now, p.last_write_at) ORDER BY g.ord),
           array_agg(q.encryption_enabled ORDER BY g.ord)
      INTO v_next, v_win, v_ts, v_enc
      FROM unnest(v_gp) WITH ORDINALITY AS g(pid, ord)
      JOIN queen.log_partitions p ON p.id = g.pid
      JOIN queen.queues q ON q.id = p.queue_id;
    IF EXISTS (SELECT 1 FROM generate_subscripts(v_gp, 1) AS g
                WHERE CASE WHEN p_sealed IS NULL THEN v_enc[g] ELSE p_sealed[g] <> v_enc[g] END) THEN
        PERFORM queen._refuse('encryption_mismatch',
                              (SELECT jsonb_object_agg(p_queues[g], v_enc[g]) FROM generate_subscripts(v_gp, 1) AS g)::text);
    END IF;

    -- 4-6 when every group holds exactly one item, item i in group i (1-item pushes to different
    -- partitions, fused by the broker): no repeat inside the call is possible, so an item is a duplicate
    -- only of a stored message and a survivor's offset is its partition's next_offset. The verdicts and
    -- the writes of steps 4-5 in one statement, without their window and group work (~10 % less
    -- PostgreSQL CPU for 8 groups x 1 item, benchmarks/sql_push.py case c); else steps 4-6 below.
    IF cardinality(p_item_group) = cardinality(v_gp) THEN
        WITH it AS MATERIALIZED (
            SELECT u.ord::integer AS ord, u.grp, u.hash, u.msgid, t.msg_offset AS old_off, t.message_id AS old_id
              FROM unnest(p_item_group, p_item_hash, p_item_msgid) WITH ORDINALITY AS u(grp, hash, msgid, ord)
              LEFT JOIN LATERAL (
                    SELECT lt.msg_offset, lt.message_id, lt.created_at FROM queen.log_txns lt
                     WHERE lt.partition_id = v_gp[u.grp] AND lt.txn_hash = u.hash
                     ORDER BY lt.msg_offset DESC LIMIT 1) t
                     ON t.created_at > v_ts[u.grp] - make_interval(secs => v_win[u.grp])
        ), ok AS MATERIALIZED (
            SELECT bool_and(it.grp = it.ord) AS ok FROM it
        ), seg AS (
            INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, created_at, dropped, codec, payload, sealed)
            SELECT v_gp[it.grp], v_next[it.grp], v_next[it.grp] + 1, v_ts[it.grp], NULL, coalesce(p_codecs[it.grp], 1),
                   p_blobs[it.grp], p_sealed IS NOT NULL AND coalesce(p_sealed[it.grp], true)
              FROM it, ok
             WHERE it.old_off IS NULL AND ok.ok
             ORDER BY 1
        ), tx AS (
            INSERT INTO queen.log_txns (partition_id, txn_hash, msg_offset, message_id, created_at)
            SELECT v_gp[it.grp], it.hash, v_next[it.grp], it.msgid, v_ts[it.grp]
              FROM it, ok
             WHERE it.old_off IS NULL AND ok.ok
        ), up AS (
            UPDATE queen.log_partitions p
               SET next_offset = p.next_offset + (it.old_off IS NULL)::integer,
                   segments_total = p.segments_total + (it.old_off IS NULL)::integer,
                   duplicates_total = p.duplicates_total + (it.old_off IS NOT NULL)::integer,
                   last_write_at = CASE WHEN it.old_off IS NULL THEN v_ts[it.grp] ELSE p.last_write_at END
              FROM it, ok
             WHERE p.id = v_gp[it.grp] AND ok.ok
        )
        SELECT ok.ok, a.live, a.mid, a.off, a.wpid, a.wts
          INTO v_one, r_live, r_msgid, r_off, w_pid, w_ts
          FROM ok,
               LATERAL (SELECT array_agg(it.old_off IS NULL ORDER BY it.ord) AS live,
                               array_agg(coalesce(it.old_id, it.msgid) ORDER BY it.ord) AS mid,
                               array_agg(coalesce(it.old_off, v_next[it.grp]) ORDER BY it.ord) AS off,
                               array_agg(v_gp[it.grp] ORDER BY it.ord) FILTER (WHERE it.old_off IS NULL) AS wpid,
                               array_agg(v_ts[it.grp] ORDER BY it.ord) FILTER (WHERE it.old_off IS NULL) AS wts
                          FROM it) AS a;
        IF v_one THEN
            -- 6., as below
            PERFORM queen._wake_cursors(w_pid, w_ts);
            RETURN;
        END IF;
        -- (else nothing was written: the general steps)
    END IF;

    -- 4. verdict and offset per item
    WITH it AS (
        SELECT i.ord::integer AS ord, i.grp, i.hash, i.msgid, v_gp[i.grp] AS pid,
               min(i.ord) OVER (PARTITION BY v_gp[i.grp], i.hash)::integer AS first_ord
          FROM unnest(p_item_group, p_item_hash, p_item_msgid) WITH ORDINALITY AS i(grp, hash, msgid, ord)
    ), ex AS (
        SELECT it.*, t.msg_offset AS old_off, t.message_id AS old_id,
               (t.msg_offset IS NULL AND it.first_ord = it.ord) AS live
          FROM it
          LEFT JOIN LATERAL (
                SELECT lt.msg_offset, lt.message_id, lt.created_at FROM queen.log_txns lt
                 WHERE lt.partition_id = it.pid AND lt.txn_hash = it.hash
                 ORDER BY lt.msg_offset DESC LIMIT 1) t
                 ON t.created_at > v_ts[it.grp] - make_interval(secs => v_win[it.grp])
    ), numbered AS (
        SELECT ex.*,
               CASE WHEN ex.live THEN v_next[ex.grp]
                    + count(*) FILTER (WHERE ex.live) OVER (PARTITION BY ex.grp ORDER BY ex.ord) - 1
               END AS new_off
          FROM ex
    )
    SELECT array_agg(n.live ORDER BY n.ord),
           array_agg(CASE WHEN n.live THEN n.msgid WHEN n.old_id IS NOT NULL THEN n.old_id ELSE f.msgid END
                     ORDER BY n.ord),
           array_agg(CASE WHEN n.live THEN n.new_off WHEN n.old_id IS NOT NULL THEN n.old_off ELSE f.new_off END
                     ORDER BY n.ord)
      INTO r_live, r_msgid, r_off
      FROM numbered n
      LEFT JOIN numbered f ON f.ord = n.first_ord AND n.first_ord <> n.ord;

    -- 5. one segment per group that has survivors; their hashes; the partitions' counters
    INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, created_at, dropped, codec, payload, sealed)
    SELECT v_gp[s.grp], v_next[s.grp], v_next[s.grp] + s.live_n, v_ts[s.grp],
           CASE WHEN s.dropped = '{}' THEN NULL ELSE s.dropped END, coalesce(p_codecs[s.grp], 1), p_blobs[s.grp],
           p_sealed IS NOT NULL AND coalesce(p_sealed[s.grp], true)
      FROM (SELECT i.grp,
                   count(*) FILTER (WHERE r_live[i.ord]) AS live_n,
                   coalesce(array_agg(i.frame - 1) FILTER (WHERE NOT r_live[i.ord]), '{}') AS dropped
              FROM (SELECT u.grp, u.ord::integer AS ord,
                           row_number() OVER (PARTITION BY u.grp ORDER BY u.ord)::integer AS frame
                      FROM unnest(p_item_group) WITH ORDINALITY AS u(grp, ord)) AS i
             GROUP BY i.grp) AS s
     WHERE s.live_n > 0
     ORDER BY 1;

    INSERT INTO queen.log_txns AS t (partition_id, txn_hash, msg_offset, message_id, created_at)
    SELECT v_gp[u.grp], u.hash, r_off[u.ord], r_msgid[u.ord], v_ts[u.grp]
      FROM unnest(p_item_group, p_item_hash) WITH ORDINALITY AS u(grp, hash, ord)
     WHERE r_live[u.ord];

    UPDATE queen.log_partitions p
       SET next_offset = p.next_offset + c.live_n,
           segments_total = p.segments_total + (c.live_n > 0)::integer,
           duplicates_total = p.duplicates_total + c.dup_n,
           last_write_at = CASE WHEN c.live_n > 0 THEN v_ts[c.grp] ELSE p.last_write_at END
      FROM (SELECT u.grp, count(*) FILTER (WHERE r_live[u.ord]) AS live_n,
                   count(*) FILTER (WHERE NOT r_live[u.ord]) AS dup_n
              FROM unnest(p_item_group) WITH ORDINALITY AS u(grp, ord)
             GROUP BY u.grp) AS c
     WHERE p.id = v_gp[c.grp];

    -- 6. caught-up cursors of the partitions that got messages become pending (pop discovery)
    PERFORM queen._wake_cursors(array_agg(v_gp[w.grp]), array_agg(v_ts[w.grp]))
       FROM (SELECT DISTINCT u.grp FROM unnest(p_item_group) WITH ORDINALITY AS u(grp, ord)
              WHERE r_live[u.ord]) AS w;

END;
$$;

-- queen.push_v1: the answer as one row per item (push_v2, transaction_v1, the timer job).
CREATE OR REPLACE FUNCTION queen.push_v1(
    p_tenant      text,
    p_queues      text[],
    p_partitions  text[],
    p_blobs       bytea[],
    p_item_group  integer[],
    p_item_hash   uuid[],
    p_item_msgid  uuid[],
    p_now         timestamptz DEFAULT NULL,
    p_codecs      smallint[] DEFAULT NULL,
    p_sealed      boolean[] DEFAULT NULL
) RETURNS TABLE (idx integer, status text, message_id uuid, partition_id bigint, msg_offset bigint)
LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    SELECT * INTO c FROM queen._push_core(p_tenant, p_queues, p_partitions, p_blobs, p_item_group, p_item_hash,
                                          p_item_msgid, p_now, p_codecs, p_sealed);
    RETURN QUERY
    SELECT u.ord::integer, CASE WHEN c.r_live[u.ord] THEN 'queued' ELSE 'duplicate' END,
           c.r_msgid[u.ord], c.v_gp[u.grp], c.r_off[u.ord]
      FROM unnest(p_item_group) WITH ORDINALITY AS u(grp, ord)
     ORDER BY u.ord;
END;
$$;

-- queen.push_v3: push_v1 with compact arguments and answer, for POST /api/v1/push (JSON and binary,
-- queen_pg/engine/push.py). Encoding 2 × n uuids and decoding n result rows was the broker's largest
-- cost per pushed message.
-- Inputs:  as push_v1, but p_hashes and p_msgids are the n items' 16-byte values concatenated
--          (16 × n bytes each, n = cardinality(p_item_group); anything else raises 22023, a broker bug).
-- Result:  ONE row: partition_ids[g] and base_offsets[g] per group (a queued item's offset is its
--          group's base plus the number of queued items of its group before it, in item order; its
--          message id is the one it was given), and only the duplicates, in item order: dup_idx
--          (1-based item index), dup_msgid and dup_offset (the original's, as push_v1 answers them).
-- Locks, guarantees, errors: push_v1's (queen._push_core). One group whose partition exists (the common
--          case: a batch, or fused 1-item requests to one partition) takes a path of its own below, with
--          the same locks, guarantees and answers in 3-5 small statements instead of ~15 (PostgreSQL
--          CPU of a 1-item call ~450 -> ~170 us, of a 100-item call ~18 -> ~12 us per message, with
--          log_txns' foreign key gone: benchmarks/sql_push.py); p_item_group is then not read (every
--          item is group 1). Several items: each 16-byte slice is parsed to a uuid once, and one probe
--          statement (one ANY index scan of log_txns for all the hashes, and a repeat check) tells
--          whether any verdict can be a duplicate; when none can (the usual case) the items are stored
--          by a plain insert statement, without the verdict statement's window functions, sorts and
--          self-join (PostgreSQL CPU per message of a 100-item call -17 %, of an 8-item call -15 %, of a
--          100-item call half duplicates +1 %; WAL unchanged: benchmarks/sql_push.py, paired A/B, medians
--          of 8 runs).
CREATE OR REPLACE FUNCTION queen.push_v3(
    p_tenant      text,
    p_queues      text[],
    p_partitions  text[],
    p_blobs       bytea[],
    p_item_group  integer[],
    p_hashes      bytea,
    p_msgids      bytea,
    p_now         timestamptz DEFAULT NULL,
    p_codecs      smallint[] DEFAULT NULL,
    p_sealed      boolean[] DEFAULT NULL,
    OUT partition_ids bigint[],
    OUT base_offsets  bigint[],
    OUT dup_idx       integer[],
    OUT dup_msgid     uuid[],
    OUT dup_offset    bigint[]
)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$  -- see queen._push_core
DECLARE
    n       integer := coalesce(cardinality(p_item_group), 0);
    v_hash  uuid[];
    v_msgid uuid[];
    c       record;
    -- the one-group path
    v_pid   bigint;
    v_qid   bigint;
    v_next  bigint;
    v_last  timestamptz;
    v_ts    timestamptz;
    v_live  bigint;
    v_enc   boolean;
    v_bad   boolean;
    v_dups  boolean;  -- more than one item: a verdict may be a duplicate (a stored hash, a repeat)
    v_win   integer;  -- more than one item: the queue's dedup window (seconds), read with the probe
    v_hash1 uuid;     -- one item: its hash and id
    v_mid1  uuid;
    v_ooff  bigint;   -- one item: the stored original's offset and id (a duplicate)
    v_oid   uuid;
BEGIN
    IF length(p_hashes) <> 16 * n OR length(p_msgids) <> 16 * n THEN
        RAISE EXCEPTION 'push_v3: % items but % hash bytes and % message id bytes', n, length(p_hashes),
              length(p_msgids) USING ERRCODE = '22023';
    END IF;

    -- One group (every item to one partition: a batch, or fused 1-item requests), the partition
    -- existing: _push_core's steps in a few statements, one item apart (a test holds the answers and
    -- the stored state equal to the general path's, tests/test_push_v3.py). Else (several groups, a
    -- partition to create) the general path below.
    IF cardinality(p_queues) = 1 AND n > 0 THEN
        -- steps 1-3: the partition and its write lock (queues are not locked: nothing is created)
        SELECT p.id, p.queue_id, p.next_offset, p.last_write_at INTO v_pid, v_qid, v_next, v_last
          FROM queen.log_partitions p
         WHERE p.queue_id = (SELECT q.id FROM queen.queues q WHERE q.tenant = p_tenant AND q.name = p_queues[1])
           AND p.name = p_partitions[1]
           FOR NO KEY UPDATE OF p;
        IF FOUND AND n = 1 THEN
            -- one item (a single push, the latency case): small statements with small plans (executor
            -- start-up of the set statement below was most of a 1-item push's cost)
            v_ts := greatest(coalesce(p_now, clock_timestamp()), v_last);
            v_hash1 := encode(p_hashes, 'hex')::uuid;
            v_mid1 := encode(p_msgids, 'hex')::uuid;
            -- the queue row read after the lock (a new snapshot); the newest stored message of the hash
            SELECT q.encryption_enabled,
                   CASE WHEN p_sealed IS NULL THEN q.encryption_enabled
                        ELSE p_sealed[1] <> q.encryption_enabled END IS TRUE,
                   t.msg_offset, t.message_id
              INTO v_enc, v_bad, v_ooff, v_oid
              FROM queen.queues q
              LEFT JOIN LATERAL (
                    SELECT lt.msg_offset, lt.message_id, lt.created_at FROM queen.log_txns lt
                     WHERE lt.partition_id = v_pid AND lt.txn_hash = v_hash1
                     ORDER BY lt.msg_offset DESC LIMIT 1) t
                     ON t.created_at > v_ts - make_interval(secs => q.dedup_window_seconds)
             WHERE q.id = v_qid;
            IF v_bad THEN
                PERFORM queen._refuse('encryption_mismatch', jsonb_build_object(p_queues[1], v_enc)::text);
            END IF;
            IF v_ooff IS NOT NULL THEN
                UPDATE queen.log_partitions p SET duplicates_total = p.duplicates_total + 1 WHERE p.id = v_pid;
                v_live := 0;
                dup_idx := '{1}';
                dup_msgid := ARRAY[v_oid];
                dup_offset := ARRAY[v_ooff];
            ELSE
                WITH seg AS (
                    INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, created_at, dropped,
                                                    codec, payload, sealed)
                    VALUES (v_pid, v_next, v_next + 1, v_ts, NULL, coalesce(p_codecs[1], 1), p_blobs[1],
                            p_sealed IS NOT NULL AND coalesce(p_sealed[1], true))
                ), tx AS (
                    INSERT INTO queen.log_txns (partition_id, txn_hash, msg_offset, message_id, created_at)
                    VALUES (v_pid, v_hash1, v_next, v_mid1, v_ts)
                )
                UPDATE queen.log_partitions p
                   SET next_offset = p.next_offset + 1, segments_total = p.segments_total + 1, last_write_at = v_ts
                 WHERE p.id = v_pid;
                v_live := 1;
                dup_idx := '{}';
                dup_msgid := '{}';
                dup_offset := '{}';
            END IF;
        ELSIF FOUND THEN
            v_ts := greatest(coalesce(p_now, clock_timestamp()), v_last);
            -- the 16-byte slices as uuids, each parsed once (uuid_in is most of the conversion's cost)
            SELECT array_agg(encode(substring(p_hashes FROM 16 * i + 1 FOR 16), 'hex')::uuid ORDER BY i),
                   array_agg(encode(substring(p_msgids FROM 16 * i + 1 FOR 16), 'hex')::uuid ORDER BY i)
              INTO v_hash, v_msgid
              FROM generate_series(0, n - 1) AS i;
            -- the queue row read after the lock (a new snapshot); whether any verdict can be a duplicate:
            -- a stored row of one of the hashes inside the window (one index scan for all of them), or a
            -- hash twice in the call. None (the usual case): every item is stored, in item order. The
            -- probe asks for any stored row of a hash inside the window: none means the newest is not
            -- inside it either (the rule), and any sends the call to the verdict statement below, which
            -- decides by the newest row of each hash as before.
            SELECT q.encryption_enabled,
                   CASE WHEN p_sealed IS NULL THEN q.encryption_enabled
                        ELSE p_sealed[1] <> q.encryption_enabled END IS TRUE,
                   EXISTS (SELECT 1 FROM queen.log_txns lt
                            WHERE lt.partition_id = v_pid AND lt.txn_hash = ANY (v_hash)
                              AND lt.created_at > v_ts - make_interval(secs => q.dedup_window_seconds))
                   OR (SELECT count(DISTINCT h) FROM unnest(v_hash) AS h) <> n,
                   q.dedup_window_seconds
              INTO v_enc, v_bad, v_dups, v_win
              FROM queen.queues q
             WHERE q.id = v_qid;
            IF v_bad THEN
                PERFORM queen._refuse('encryption_mismatch', jsonb_build_object(p_queues[1], v_enc)::text);
            END IF;
            IF NOT v_dups THEN
                WITH seg AS (
                    INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, created_at, dropped,
                                                    codec, payload, sealed)
                    VALUES (v_pid, v_next, v_next + n, v_ts, NULL, coalesce(p_codecs[1], 1), p_blobs[1],
                            p_sealed IS NOT NULL AND coalesce(p_sealed[1], true))
                ), tx AS (
                    INSERT INTO queen.log_txns (partition_id, txn_hash, msg_offset, message_id, created_at)
                    SELECT v_pid, u.hash, v_next + u.ord - 1, u.msgid, v_ts
                      FROM unnest(v_hash, v_msgid) WITH ORDINALITY AS u(hash, msgid, ord)
                )
                UPDATE queen.log_partitions p
                   SET next_offset = p.next_offset + n, segments_total = p.segments_total + 1, last_write_at = v_ts
                 WHERE p.id = v_pid;
                v_live := n;
                dup_idx := '{}';
                dup_msgid := '{}';
                dup_offset := '{}';
            ELSE
                -- steps 4-5 in one statement: the verdicts (a repeat inside the call is a duplicate of
                -- its first item, which may itself be a duplicate of a stored message; the stored
                -- original is the newest row of the hash, found for every hash by one ANY index scan)
                -- and the writes
                WITH it AS (
                    SELECT u.ord::integer AS ord, u.hash, u.msgid
                      FROM unnest(v_hash, v_msgid) WITH ORDINALITY AS u(hash, msgid, ord)
                ), ex AS (
                    SELECT it.ord, it.hash, it.msgid, t.msg_offset AS old_off, t.message_id AS old_id,
                           (t.msg_offset IS NULL AND min(it.ord) OVER (PARTITION BY it.hash) = it.ord) AS live
                      FROM it
                      LEFT JOIN (
                            SELECT DISTINCT ON (lt.txn_hash) lt.txn_hash, lt.msg_offset, lt.message_id, lt.created_at
                              FROM queen.log_txns lt
                             WHERE lt.partition_id = v_pid AND lt.txn_hash = ANY (v_hash)
                             ORDER BY lt.txn_hash, lt.msg_offset DESC) t
                             ON t.txn_hash = it.hash
                            AND t.created_at > v_ts - make_interval(secs => v_win)
                ), nb AS MATERIALIZED (
                    SELECT ex.*,
                           CASE WHEN ex.live THEN v_next + count(*) FILTER (WHERE ex.live) OVER (ORDER BY ex.ord) - 1
                           END AS new_off
                      FROM ex
                ), agg AS MATERIALIZED (
                    SELECT count(*) FILTER (WHERE nb.live) AS live_n, count(*) FILTER (WHERE NOT nb.live) AS dup_n,
                           array_agg(nb.ord - 1 ORDER BY nb.ord) FILTER (WHERE NOT nb.live) AS dropped
                      FROM nb
                ), seg AS (
                    INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, created_at, dropped,
                                                    codec, payload, sealed)
                    SELECT v_pid, v_next, v_next + agg.live_n, v_ts, agg.dropped, coalesce(p_codecs[1], 1), p_blobs[1],
                           p_sealed IS NOT NULL AND coalesce(p_sealed[1], true)
                      FROM agg
                     WHERE agg.live_n > 0
                ), tx AS (
                    INSERT INTO queen.log_txns (partition_id, txn_hash, msg_offset, message_id, created_at)
                    SELECT v_pid, nb.hash, nb.new_off, nb.msgid, v_ts
                      FROM nb
                     WHERE nb.live
                ), up AS (
                    UPDATE queen.log_partitions p
                       SET next_offset = p.next_offset + agg.live_n,
                           segments_total = p.segments_total + (agg.live_n > 0)::integer,
                           duplicates_total = p.duplicates_total + agg.dup_n,
                           last_write_at = CASE WHEN agg.live_n > 0 THEN v_ts ELSE p.last_write_at END
                      FROM agg
                     WHERE p.id = v_pid
                )
                SELECT agg.live_n, coalesce(d.idx, '{}'), coalesce(d.mid, '{}'), coalesce(d.off, '{}')
                  INTO v_live, dup_idx, dup_msgid, dup_offset
                  FROM agg,
                       LATERAL (SELECT array_agg(n1.ord ORDER BY n1.ord) AS idx,
                                       array_agg(coalesce(n1.old_id, f.msgid) ORDER BY n1.ord) AS mid,
                                       array_agg(CASE WHEN n1.old_id IS NOT NULL THEN n1.old_off ELSE f.new_off END
                                                 ORDER BY n1.ord) AS off
                                  FROM nb n1
                                  LEFT JOIN nb f ON f.hash = n1.hash AND f.live
                                 WHERE NOT n1.live) AS d;
            END IF;
        END IF;
        IF v_pid IS NOT NULL THEN
            -- step 6
            IF v_live > 0 THEN
                PERFORM 1 FROM queen.log_consumers lc
                 WHERE lc.partition_id = v_pid AND lc.head_at IS NULL
                 ORDER BY lc.partition_id, lc.consumer_group
                   FOR NO KEY UPDATE;
                IF FOUND THEN  -- a new statement: it sees the rows as they are now that we hold them
                    UPDATE queen.log_consumers lc SET head_at = v_ts
                     WHERE lc.partition_id = v_pid AND lc.head_at IS NULL;
                END IF;
            END IF;
            partition_ids := ARRAY[v_pid];
            base_offsets := ARRAY[v_next];
            RETURN;
        END IF;
    END IF;

    SELECT array_agg(encode(substring(p_hashes FROM 16 * i + 1 FOR 16), 'hex')::uuid ORDER BY i),
           array_agg(encode(substring(p_msgids FROM 16 * i + 1 FOR 16), 'hex')::uuid ORDER BY i)
      INTO v_hash, v_msgid
      FROM generate_series(0, n - 1) AS i;
    SELECT * INTO c FROM queen._push_core(p_tenant, p_queues, p_partitions, p_blobs, p_item_group, v_hash,
                                          v_msgid, p_now, p_codecs, p_sealed);
    partition_ids := c.v_gp;
    base_offsets := c.v_next;
    SELECT coalesce(array_agg(u.ord::integer ORDER BY u.ord), '{}'),
           coalesce(array_agg(c.r_msgid[u.ord] ORDER BY u.ord), '{}'),
           coalesce(array_agg(c.r_off[u.ord] ORDER BY u.ord), '{}')
      INTO dup_idx, dup_msgid, dup_offset
      FROM generate_subscripts(p_item_group, 1) AS u(ord)
     WHERE NOT c.r_live[u.ord];
END;
$$;
