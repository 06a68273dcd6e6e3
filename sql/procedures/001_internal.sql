-- Internal helpers shared by the push, pop and transaction procedures (and, for the group names, by
-- every procedure and view that shows a group). Not called by routes.
--
-- queen._create_partitions(tenant, queue_ids[], names[]) -> void
--   Creates the (queue_id, name) partitions that do not exist yet, with a cursor row (offset 0)
--   for every consumer group the queue already has.
--   Locks: queues FOR UPDATE (ascending id) of the queues that get a partition (docs/architecture.md#lock-order #1),
--   so a group created concurrently either sees the new partition or is seen by it.
--
-- queen._create_group(queue_id, tenant, group, mode, from, now) -> void
--   Creates a consumer group and one cursor row per existing partition. A `from` timestamp starts each
--   cursor at the first message written at or after it; mode 'new' (or 'new-only') at the first message
--   written after the group came to be (its first pop); any other mode (all, from_beginning, unknown) at
--   the first retained message (docs/wire.md#subscription; the broker normalizes the mode before it gets here).
--   Locks: the queue row FOR UPDATE (docs/architecture.md#lock-order #1). `now` NULL = the clock, read after that lock
--   wait ('new' mode starts at the time the group really came to be).
--
-- queen._cursor_head(partition_id, cursor) -> timestamptz: what log_consumers.head_at must say for a
--   cursor (schema.sql): the created_at of the segment holding it while the partition has a message at
--   or above it, NULL when it is caught up. Called by the triggers log_consumers_head_ins/_upd (every
--   insert of a cursor row and every move of cursor_offset) and by pop_v1 for a row it found caught up.
--   Locks: the caller holds the cursor row (level 3). "Caught up" is only decided while no writer
--   holds the partition: a try-lock FOR SHARE SKIP LOCKED on the partition row (level 2; it never
--   waits, docs/architecture.md#lock-order), which conflicts with the push's FOR NO KEY UPDATE. If a writer holds it,
--   the cursor is marked pending at the clock (its append may be for us and its queen._wake_cursors
--   cannot see our uncommitted NULL); a pop that finds such a row with nothing to read recomputes it.
--
-- queen._head_of(partition_id, cursor) -> timestamptz: head_at of a cursor known to be below its
--   partition's next_offset (committed data only, no lock): _cursor_head, _create_group (which sets the
--   pending cursors' heads itself; the insert trigger runs only for a row inserted with head_at NULL)
--   and the one-time fill below.
--
-- queen._wake_cursors(partition_ids[], times[]) -> void: a partition got messages written at times[i]:
--   its caught-up cursors (head_at NULL) become pending at that time. Called by push_v1 and
--   dlq_requeue_v1 after the append, while they hold the partition rows (level 2); locks the cursor
--   rows it changes FOR NO KEY UPDATE, ascending (partition_id, group) (level 3).
--
-- queen._le(value, bytes) -> bytea: little-endian unsigned integer of `bytes` bytes.
-- queen._frame(message_id, transaction_id, payload bytes, producer_sub) -> bytea: one QPF1 frame
--   (docs/wire.md#framed-pop), byte for byte what queen_pg/engine/codec.py encode_frame() writes: flag 2 with a producerSub,
--   flag 4 when the payload is sealed (queen_pg/security/crypto.py). For SQL callers that write a raw
--   (codec 0) segment: the DLQ requeue and the timer job.
--
-- queen._verdict(reason, detail jsonb): raises SQLSTATE QN000 with MESSAGE = reason and DETAIL = the
--   detail as JSON text. A verdict aborts the statement, so everything the call wrote is rolled back
--   without savepoints; queen_pg/db maps it to queen_pg.errors.Verdict, which the routes answer as
--   HTTP 200 {"success": false, "reason": ..., ...detail} (or the family's own verdict shape).
--
-- queen._expired_sweep(lock, table, keys[], limit, now) -> integer
--   The one sweep of rows past their expires_at (kv_sweep_v1, outcomes_prune_v1): under the job's
--   try-lock `lock` (losers return 0 at once), at most `limit` rows of `table` (a table with an
--   expires_at column, whose primary key is `keys`), oldest expiry first, FOR UPDATE SKIP LOCKED (a row
--   a writer is rewriting is left for the next tick); the delete re-checks the expiry, so a row made
--   live again meanwhile is never deleted. Answers how many it deleted.
--
-- queen._queue_mode(group) -> boolean: the stored group is queue mode, which is stored as the group
--   '__QUEUE_MODE__' (the broker passes queen_pg/engine/pop.py QUEUE_MODE for a pop without a group).
-- queen._group_out(group) -> text: a stored group as the wire shows it (consumerGroup, a group's
--   name): NULL for queue mode, the name otherwise. Both are the rule written once: SQL functions the
--   planner inlines (IMMUTABLE, not STRICT), so they cost nothing where a query uses them.

CREATE OR REPLACE FUNCTION queen._create_partitions(p_tenant text, p_queue_ids bigint[], p_names text[])
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM queen.queues q
     WHERE q.id IN (SELECT DISTINCT m.qid FROM unnest(p_queue_ids, p_names) AS m(qid, name)
                     WHERE NOT EXISTS (SELECT 1 FROM queen.log_partitions p
                                        WHERE p.queue_id = m.qid AND p.name = m.name))
     ORDER BY q.id
       FOR UPDATE;

    WITH created AS (
        INSERT INTO queen.log_partitions (tenant, queue_id, name)
        SELECT DISTINCT p_tenant, m.qid, m.name
          FROM unnest(p_queue_ids, p_names) AS m(qid, name)
         ORDER BY 2, 3
        ON CONFLICT (queue_id, name) DO NOTHING
        RETURNING id, queue_id
    )
    INSERT INTO queen.log_consumers (partition_id, consumer_group, queue_id, tenant, cursor_offset)
    SELECT c.id, g.name, c.queue_id, p_tenant, 0
      FROM created c
      JOIN queen.log_groups g ON g.queue_id = c.queue_id
    ON CONFLICT DO NOTHING;
END;
$$;

CREATE OR REPLACE FUNCTION queen._create_group(
    p_queue_id bigint, p_tenant text, p_group text, p_mode text, p_from timestamptz, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_from timestamptz;
    v_now  timestamptz;
BEGIN
    PERFORM 1 FROM queen.queues WHERE id = p_queue_id FOR UPDATE;
    IF EXISTS (SELECT 1 FROM queen.log_groups WHERE queue_id = p_queue_id AND name = p_group) THEN
        RETURN;  -- created by a concurrent pop while we waited for the lock
    END IF;
    v_now := coalesce(p_now, clock_timestamp());  -- after the lock wait
    v_from := CASE WHEN p_from IS NOT NULL THEN p_from
                   WHEN p_mode IN ('new', 'new-only') THEN v_now
                   ELSE NULL END;
    INSERT INTO queen.log_groups (queue_id, name, tenant, subscription_mode, subscribed_from, created_at)
    VALUES (p_queue_id, p_group, p_tenant, coalesce(p_mode, 'all'), v_from, v_now);

    -- head_at of the pending cursors in the same pass (committed segments: a pending one stays so);
    -- the caught-up ones (NULL) go through the insert trigger, which decides it under its try-lock
    INSERT INTO queen.log_consumers (partition_id, consumer_group, queue_id, tenant, cursor_offset, head_at)
    SELECT x.id, p_group, p_queue_id, p_tenant, x.cursor,
           CASE WHEN x.cursor < x.next_offset THEN queen._head_of(x.id, x.cursor) END
      FROM (SELECT p.id, p.next_offset,
                   CASE WHEN v_from IS NULL THEN
                            coalesce((SELECT min(s.base_offset) FROM queen.log_segments s
                                       WHERE s.partition_id = p.id), p.next_offset)
                        ELSE
                            coalesce((SELECT min(s.base_offset) FROM queen.log_segments s
                                       WHERE s.partition_id = p.id AND s.created_at >= v_from), p.next_offset)
                   END AS cursor
              FROM queen.log_partitions p
             WHERE p.queue_id = p_queue_id) AS x
    ON CONFLICT DO NOTHING;
END;
$$;

CREATE OR REPLACE FUNCTION queen._head_of(p_pid bigint, p_cursor bigint)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    -- for a cursor below its partition's next_offset (committed): the time of the segment holding it,
    -- else of the first segment above it (the one holding it is gone), else -infinity
    SELECT coalesce(
        (SELECT CASE WHEN h.end_offset > p_cursor THEN h.created_at END
           FROM (SELECT s.created_at, s.end_offset FROM queen.log_segments s
                  WHERE s.partition_id = p_pid AND s.base_offset <= p_cursor
                  ORDER BY s.base_offset DESC LIMIT 1) h),
        (SELECT min(s.created_at) FROM queen.log_segments s
          WHERE s.partition_id = p_pid AND s.base_offset > p_cursor),
        '-infinity');
$$;

CREATE OR REPLACE FUNCTION queen._cursor_head(p_pid bigint, p_cursor bigint)
RETURNS timestamptz
LANGUAGE plpgsql SET enable_seqscan = off AS $$  -- by key whatever the statistics (tests/test_ack_plans.py)
DECLARE
    v_at   timestamptz;
    v_end  bigint;
    v_next bigint;
BEGIN
    SELECT s.created_at, s.end_offset INTO v_at, v_end FROM queen.log_segments s
     WHERE s.partition_id = p_pid AND s.base_offset <= p_cursor
     ORDER BY s.base_offset DESC LIMIT 1;
    IF v_end > p_cursor THEN
        RETURN v_at;                         -- a committed message at the cursor
    END IF;
    SELECT p.next_offset INTO v_next FROM queen.log_partitions p WHERE p.id = p_pid FOR SHARE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN clock_timestamp();            -- a writer holds the partition: maybe pending
    END IF;
    IF v_next <= p_cursor THEN
        RETURN NULL;                         -- caught up; the next append wakes it (_wake_cursors)
    END IF;
    RETURN queen._head_of(p_pid, p_cursor);  -- appended since the first look, or its segment is gone
END;
$$;

CREATE OR REPLACE FUNCTION queen._cursor_head_trg()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.head_at := queen._cursor_head(NEW.partition_id, NEW.cursor_offset);
    RETURN NEW;
END;
$$;

CREATE OR REPLACE FUNCTION queen._wake_cursors(p_pids bigint[], p_times timestamptz[])
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM queen.log_consumers lc
     WHERE lc.partition_id = ANY (p_pids) AND lc.head_at IS NULL
     ORDER BY lc.partition_id, lc.consumer_group
       FOR NO KEY UPDATE;
    IF FOUND THEN  -- a new statement: it sees the rows as they are now that we hold them
        UPDATE queen.log_consumers lc SET head_at = w.at
          FROM unnest(p_pids, p_times) AS w(pid, at)
         WHERE lc.partition_id = w.pid AND lc.head_at IS NULL;
    END IF;
END;
$$;

-- The triggers that keep head_at, created once (CREATE TRIGGER locks the table against writes: not
-- at every boot). The first creation fills head_at for the rows that exist, under a SHARE lock on
-- log_partitions so that no push is halfway meanwhile (from its commit on, every writer keeps it).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'log_consumers_head_upd'
                    AND tgrelid = 'queen.log_consumers'::regclass) THEN
        LOCK TABLE queen.log_partitions IN SHARE MODE;
        CREATE TRIGGER log_consumers_head_ins BEFORE INSERT ON queen.log_consumers
            FOR EACH ROW WHEN (NEW.head_at IS NULL) EXECUTE FUNCTION queen._cursor_head_trg();
        CREATE TRIGGER log_consumers_head_upd BEFORE UPDATE OF cursor_offset ON queen.log_consumers
            FOR EACH ROW WHEN (OLD.cursor_offset IS DISTINCT FROM NEW.cursor_offset)
            EXECUTE FUNCTION queen._cursor_head_trg();
        UPDATE queen.log_consumers lc
           SET head_at = CASE WHEN lc.cursor_offset < p.next_offset
                              THEN queen._head_of(lc.partition_id, lc.cursor_offset) END
          FROM queen.log_partitions p
         WHERE p.id = lc.partition_id;
    END IF;
END;
$$;

-- Every boot: a cursor with something to read and no head is made pending. A broker of the previous
-- release re-applies its own sql/ when it boots (an old replica restarting during a rolling deploy, a
-- rollback): its push_v1 does not wake cursors while the triggers above stay and keep marking them
-- caught up, so its appends strand messages that this release's pops would never see. Only ever sets
-- heads (a head set where nothing is left is cleaned by the next pop), so no partition lock: the
-- cursor rows, ascending (docs/architecture.md#lock-order #3). Cost: one pass over log_consumers.
DO $$
BEGIN
    PERFORM 1 FROM queen.log_consumers lc JOIN queen.log_partitions p ON p.id = lc.partition_id
     WHERE lc.head_at IS NULL AND lc.cursor_offset < p.next_offset
     ORDER BY lc.partition_id, lc.consumer_group
       FOR NO KEY UPDATE OF lc;
    IF FOUND THEN
        UPDATE queen.log_consumers lc
           SET head_at = queen._head_of(lc.partition_id, lc.cursor_offset)
          FROM queen.log_partitions p
         WHERE p.id = lc.partition_id AND lc.head_at IS NULL AND lc.cursor_offset < p.next_offset;
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION queen._le(p_value bigint, p_bytes integer)
RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$
    SELECT string_agg(set_byte('\x00'::bytea, 0, ((p_value >> (8 * i)) & 255)::integer), ''::bytea ORDER BY i)
      FROM generate_series(0, p_bytes - 1) AS i;
$$;

-- queen._frame(message_id, txn, payload, sub) -> bytea: one QPF1 frame (docs/wire.md#framed-pop), as the broker
-- writes them (queen_pg/engine/codec.py): flag 2 with the producerSub when p_sub is not NULL; flag 4 when
-- the payload is sealed (an encrypted queue's: it starts with a NUL byte, which JSON text never does).
CREATE OR REPLACE FUNCTION queen._frame(p_message_id uuid, p_txn text, p_payload bytea, p_sub text DEFAULT NULL)
RETURNS bytea
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_txn   bytea := convert_to(p_txn, 'UTF8');
    v_sub   bytea := convert_to(p_sub, 'UTF8');
    v_flags integer := 0;
    v_body  bytea;
BEGIN
    IF v_sub IS NOT NULL THEN
        v_sub := substring(v_sub FROM 1 FOR 65535);
        v_flags := v_flags | 2;
    END IF;
    IF substring(p_payload FROM 1 FOR 1) = '\x00'::bytea THEN
        v_flags := v_flags | 4;
    END IF;
    v_body := set_byte('\x00'::bytea, 0, v_flags) || uuid_send(p_message_id) || queen._le(length(v_txn), 2) || v_txn
              || CASE WHEN v_sub IS NULL THEN ''::bytea ELSE queen._le(length(v_sub), 2) || v_sub END
              || p_payload;
    RETURN queen._le(length(v_body), 4) || v_body;
END;
$$;

CREATE OR REPLACE FUNCTION queen._verdict(p_reason text, p_detail jsonb)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'QN000', MESSAGE = p_reason, DETAIL = coalesce(p_detail, '{}'::jsonb)::text;
END;
$$;

CREATE OR REPLACE FUNCTION queen._expired_sweep(
    p_lock bigint, p_table regclass, p_keys text[], p_limit integer, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_deleted integer;
BEGIN
    IF NOT pg_try_advisory_xact_lock(p_lock) THEN
        RETURN 0;
    END IF;
    EXECUTE format(
        'WITH doomed AS (SELECT %1$s FROM %2$s t WHERE t.expires_at <= $1 ORDER BY t.expires_at'
        '                 LIMIT greatest($2, 1) FOR UPDATE SKIP LOCKED)'
        ' DELETE FROM %2$s t USING doomed d WHERE (%3$s) = (%4$s) AND t.expires_at <= $1',
        (SELECT string_agg('t.' || quote_ident(k), ', ') FROM unnest(p_keys) AS k), p_table,
        (SELECT string_agg('t.' || quote_ident(k), ', ') FROM unnest(p_keys) AS k),
        (SELECT string_agg('d.' || quote_ident(k), ', ') FROM unnest(p_keys) AS k))
      USING coalesce(p_now, clock_timestamp()), p_limit;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END;
$$;

CREATE OR REPLACE FUNCTION queen._queue_mode(p_group text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_group = '__QUEUE_MODE__'
$$;

CREATE OR REPLACE FUNCTION queen._group_out(p_group text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN queen._queue_mode(p_group) THEN NULL ELSE p_group END
$$;
