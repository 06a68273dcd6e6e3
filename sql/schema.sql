-- queen-pg schema: the log engine's tables.
--
-- Applied at every boot (queen_pg/db/apply.py) before sql/procedures/*.sql, in one transaction
-- under advisory lock APPLY_LOCK (docs/architecture.md#lock-order). Every statement is idempotent: CREATE ... IF NOT
-- EXISTS only. A changed table ships as an alembic revision under migrations/ AND as the new shape
-- here, written so that both paths give the same catalog (tests/test_migrations.py).
--
-- Tenancy: queues, log_partitions, log_groups, log_consumers and log_dlq carry `tenant`.
-- log_segments and log_txns are keyed by partition_id, a surrogate that is unique across tenants
-- and belongs to exactly one tenant through log_partitions, so multi-tenancy never needs a
-- storage migration.
--
-- Offsets: each partition has a gapless BIGINT offset sequence starting at 0. Ranges are half-open:
-- a segment holds [base_offset, end_offset); a consumer has completed everything below
-- cursor_offset; a lease covers [cursor_offset, lease_end).

CREATE SCHEMA IF NOT EXISTS queen;

-- A column added by a revision, only when missing: ALTER TABLE takes an ACCESS EXCLUSIVE lock, which a
-- booting replica must not take on every boot while others serve traffic. (A nullable column without a
-- default rewrites nothing.)
CREATE OR REPLACE FUNCTION queen._add_column(p_table regclass, p_column text, p_type text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                    WHERE attrelid = p_table AND attname = p_column AND NOT attisdropped) THEN
        EXECUTE format('ALTER TABLE %s ADD COLUMN %I %s', p_table, p_column, p_type);
    END IF;
END;
$$;

-- A constraint a revision dropped, only when it is there (ACCESS EXCLUSIVE, as above).
CREATE OR REPLACE FUNCTION queen._drop_constraint(p_table regclass, p_name text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_constraint WHERE conname = p_name AND conrelid = p_table) THEN
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', p_table, p_name);
    END IF;
END;
$$;

-- A queue: identity and configuration (field names and defaults as docs/wire.md#configure).
CREATE TABLE IF NOT EXISTS queen.queues (
    id                      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant                  text NOT NULL,
    name                    text NOT NULL,
    namespace               text,
    task                    text,
    lease_time              integer NOT NULL DEFAULT 300,      -- seconds
    retry_limit             integer NOT NULL DEFAULT 3,
    priority                integer NOT NULL DEFAULT 0,
    delayed_processing      integer NOT NULL DEFAULT 0,        -- seconds before a message is visible
    window_buffer           integer NOT NULL DEFAULT 0,        -- seconds a partition must be quiet
    max_size                integer NOT NULL DEFAULT 0,
    retention_seconds       integer NOT NULL DEFAULT 0,
    completed_retention_seconds integer NOT NULL DEFAULT 0,
    dedup_window_seconds    integer NOT NULL DEFAULT 3600,
    encryption_enabled      boolean NOT NULL DEFAULT false,
    options                 jsonb NOT NULL DEFAULT '{}'::jsonb, -- every option as last configured
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT queues_tenant_name_key UNIQUE (tenant, name)
);
CREATE INDEX IF NOT EXISTS queues_tenant_namespace_task_idx ON queen.queues (tenant, namespace, task);

-- A partition: an ordered lane of a queue. The row is the partition's write lock: a push takes it
-- with FOR UPDATE in ascending id order. Frequently updated, never on an indexed column: HOT.
CREATE TABLE IF NOT EXISTS queen.log_partitions (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant              text NOT NULL,
    queue_id            bigint NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    name                text NOT NULL,
    next_offset         bigint NOT NULL DEFAULT 0,    -- the offset the next appended message gets
    segments_total      bigint NOT NULL DEFAULT 0,
    duplicates_total    bigint NOT NULL DEFAULT 0,
    last_write_at       timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT log_partitions_queue_name_key UNIQUE (queue_id, name)
) WITH (fillfactor = 70);

-- One row per append: the appended messages as QPF1 frames (docs/wire.md#framed-pop), zstd-compressed by the
-- broker (codec 1), or raw (codec 0) when SQL wrote the frame itself (a dead letter put back). `dropped` lists frame indexes (0-based) that are not part of the log: items of the append
-- that turned out to be duplicates of stored messages, or (a dead letter put back before the dlq_fill
-- job copied its payload out) every frame of the copied segment but the one put back. Message k of the log (k = 0, 1, ...) inside
-- this segment is the k-th frame that is not dropped; offsets stay gapless.
CREATE TABLE IF NOT EXISTS queen.log_segments (
    partition_id        bigint NOT NULL REFERENCES queen.log_partitions (id) ON DELETE CASCADE,
    base_offset         bigint NOT NULL,
    end_offset          bigint NOT NULL,               -- exclusive
    created_at          timestamptz NOT NULL,          -- rises with base_offset (stamped under the row lock)
    dropped             integer[],
    codec               smallint NOT NULL DEFAULT 1,   -- QPF1 record codec: 0 raw, 1 zstd
    payload             bytea NOT NULL,
    sealed              boolean,                       -- may hold sealed frames (flag 4); NULL: unknown
    CONSTRAINT log_segments_pkey PRIMARY KEY (partition_id, base_offset),
    CONSTRAINT log_segments_range_check CHECK (end_offset > base_offset)
);
-- Only when needed: ALTER TABLE takes an ACCESS EXCLUSIVE lock, which a booting replica must not
-- take on every boot while others serve traffic.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = 'queen.log_segments'::regclass AND attname = 'payload'
                  AND attstorage <> 'e') THEN
        ALTER TABLE queen.log_segments ALTER COLUMN payload SET STORAGE EXTERNAL;
    END IF;
END;
$$;
-- Revision 0012 (migrations/versions/0012_segments_sealed.py): `sealed` says whether a segment can hold
-- a sealed frame, so a framed pop on a broker holding keys decodes only those (to ship them opened) and
-- ships the others as stored. Every writer sets it (push: its group's p_sealed; a dead letter put back:
-- its payload's); rows written before the revision keep NULL, read as "may be sealed". Only when
-- missing (queen._add_column).
SELECT queen._add_column('queen.log_segments', 'sealed', 'boolean');

-- Dedup and lookup: xxh3-128 of the transactionId (computed by the broker), stored as uuid (16 bytes),
-- one row per stored message. A transactionId can name several messages of a partition (pushed again
-- after its dedup window, or a dead letter put back): the dedup verdict looks at the newest row, an
-- ack resolves to the oldest one its group has not settled yet. Rows go with their segment (retention);
-- the BRIN index on created_at (rows arrive in time order) lets retention find old rows cheaply
-- without a second btree on the push path.
CREATE TABLE IF NOT EXISTS queen.log_txns (
    partition_id        bigint NOT NULL,                -- no foreign key: see below
    txn_hash            uuid NOT NULL,
    msg_offset          bigint NOT NULL,
    message_id          uuid NOT NULL,
    created_at          timestamptz NOT NULL,
    CONSTRAINT log_txns_pkey PRIMARY KEY (partition_id, txn_hash, msg_offset)
);
CREATE INDEX IF NOT EXISTS log_txns_created_brin ON queen.log_txns USING brin (created_at);
-- Revision 0009: log_txns has no foreign key. Its per-row key check (an SPI lookup of the partition
-- row FOR KEY SHARE) was ~40 % of PostgreSQL's CPU per pushed message in a 100-item push. Every writer
-- of log_txns holds the partition row and writes the rows' segment in the same transaction (whose key
-- check fails if the partition is gone), and queen.delete_queue_v1 deletes the rows itself.
SELECT queen._drop_constraint('queen.log_txns', 'log_txns_partition_id_fkey');

-- A consumer group of a queue (queue mode is the group '__QUEUE_MODE__'). Created on the group's
-- first pop; `subscribed_from` NULL means "from the first retained message".
CREATE TABLE IF NOT EXISTS queen.log_groups (
    queue_id            bigint NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    name                text NOT NULL,
    tenant              text NOT NULL,
    subscription_mode   text NOT NULL DEFAULT 'all',
    subscribed_from     timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT log_groups_pkey PRIMARY KEY (queue_id, name)
);

-- One cursor and lease per (partition, group). An ack is an offset commit (docs/wire.md#ack-offset-commit): the group
-- has completed everything below cursor_offset and nothing at or above it; there is no per-message
-- state (the `acked` out-of-order array of 0.1 is gone: log_passes holds the rare admin exceptions).
CREATE TABLE IF NOT EXISTS queen.log_consumers (
    partition_id        bigint NOT NULL REFERENCES queen.log_partitions (id) ON DELETE CASCADE,
    consumer_group      text NOT NULL,
    queue_id            bigint NOT NULL,
    tenant              text NOT NULL,
    cursor_offset       bigint NOT NULL DEFAULT 0,
    lease_id            uuid,
    lease_expires_at    timestamptz,
    lease_end           bigint,
    released_lease_id   uuid,            -- last lease released by its acks: a resent ack is answered alike
    delivered_end       bigint NOT NULL DEFAULT 0, -- [cursor_offset, delivered_end) was delivered `attempts` times
    attempts            integer NOT NULL DEFAULT 0,
    fail_offset         bigint,          -- the message the retry budget is being spent on
    failures            integer NOT NULL DEFAULT 0,
    acked_total         bigint NOT NULL DEFAULT 0,
    claimed_at          timestamptz,
    CONSTRAINT log_consumers_pkey PRIMARY KEY (partition_id, consumer_group)
) WITH (fillfactor = 70);
-- Pop discovery (revision 0006): `head_at` is the time of the segment holding the cursor while the
-- group has something at or above it in the partition (its oldest pending message), NULL when it is
-- caught up. Kept by queen._cursor_head (sql/procedures/001_internal.sql) through the triggers
-- log_consumers_head_ins/_upd whenever a cursor is created or moves, and by the writers that append
-- (push_v1, dlq_requeue_v1: queen._wake_cursors) when a caught-up cursor gets a message. The index
-- gives a pop its group's claimable partitions oldest first without visiting the others; its prefix
-- (queue_id, consumer_group) also serves every per-queue/per-group lookup (the index of the same
-- prefix it replaces is dropped below). Only when missing (queen._add_column).
SELECT queen._add_column('queen.log_consumers', 'head_at', 'timestamptz');
CREATE INDEX IF NOT EXISTS log_consumers_ready_idx
    ON queen.log_consumers (queue_id, consumer_group, head_at, partition_id);
DROP INDEX IF EXISTS queen.log_consumers_queue_group_idx;
-- Leases by id (revision 0010): one row per cursor row a leased pop claims, (lease id, partition,
-- group), inserted by queen.pop_v1 in its claim statement. log_consumers has no index on lease_id, so a
-- claim (and a lease extend) rewrites no indexed column: a HOT update, no index entries. The cursor row
-- stays the truth: a row here only says where to look, every reader checks lc.lease_id = lease_id
-- (lease extend, the transaction's required lease, the lease_expiry job). Rows whose cursor no longer
-- holds that lease (acked, released, expired, claimed again, group deleted) are stale, and the
-- lease_expiry job deletes them (queen.lease_expiry_v1). No foreign key: a key check per pop would be
-- a statement of its own, and a stale row is harmless.
CREATE TABLE IF NOT EXISTS queen.log_leases (
    lease_id            uuid NOT NULL,
    partition_id        bigint NOT NULL,
    consumer_group      text NOT NULL,
    CONSTRAINT log_leases_pkey PRIMARY KEY (lease_id, partition_id, consumer_group)
);
DO $$  -- databases made before revision 0010: the live leases get their rows, then the index goes
BEGIN
    IF to_regclass('queen.log_consumers_lease_idx') IS NOT NULL THEN
        INSERT INTO queen.log_leases (lease_id, partition_id, consumer_group)
        SELECT lc.lease_id, lc.partition_id, lc.consumer_group
          FROM queen.log_consumers lc WHERE lc.lease_id IS NOT NULL
        ON CONFLICT DO NOTHING;
        DROP INDEX queen.log_consumers_lease_idx;
    END IF;
END;
$$;
-- Databases made before the offset-commit ack (revision 0002): drop the out-of-order array. Only when
-- it is there: ALTER TABLE takes an ACCESS EXCLUSIVE lock, which a booting replica must not take on
-- every boot.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = 'queen.log_consumers'::regclass AND attname = 'acked' AND NOT attisdropped) THEN
        DROP VIEW IF EXISTS queen.v_partitions CASCADE;  -- reads it; sql/procedures/090_views.sql makes it again
        ALTER TABLE queen.log_consumers DROP COLUMN acked;
    END IF;
END;
$$;

-- Offsets a consumer group passes over without receiving them (the only per-offset state of a group):
-- a dead letter put back on its partition is for the groups that dead-lettered it, so every other
-- group of the queue gets a row for the new offset; a message deleted ahead of a group's cursor gets
-- one too. A pop or an ack that moves the cursor onto a row moves it past (queen._pass_over) and
-- deletes the rows below the cursor; rows go with their cursor row (group or queue deleted).
CREATE TABLE IF NOT EXISTS queen.log_passes (
    partition_id        bigint NOT NULL,
    consumer_group      text NOT NULL,
    msg_offset          bigint NOT NULL,
    CONSTRAINT log_passes_pkey PRIMARY KEY (partition_id, consumer_group, msg_offset),
    CONSTRAINT log_passes_consumer_fkey FOREIGN KEY (partition_id, consumer_group)
        REFERENCES queen.log_consumers (partition_id, consumer_group) ON DELETE CASCADE
);

-- Dead letters, payload readable as jsonb.
CREATE TABLE IF NOT EXISTS queen.log_dlq (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant              text NOT NULL,
    -- No foreign keys: the ack inserts dead letters while it holds cursor rows (lock level 3), and a
    -- FK check would take KEY SHARE on the queue row (level 1) or the partition row (level 2), against
    -- the lock order (docs/architecture.md#lock-order): a queue delete that holds the partition rows and waits for the
    -- cursor rows would deadlock with it. queen.delete_queue_v1 deletes the queue's dead letters
    -- itself, after the cascade (which waits for every ack holding a cursor row of the queue).
    queue_id            bigint NOT NULL,
    partition_id        bigint NOT NULL,
    consumer_group      text NOT NULL,
    msg_offset          bigint NOT NULL,
    message_id          uuid,
    transaction_id      text,
    payload             jsonb,
    error               text,
    attempts            integer NOT NULL DEFAULT 0,
    created_at          timestamptz,                  -- when the message was pushed
    failed_at           timestamptz NOT NULL DEFAULT now()
);
SELECT queen._drop_constraint('queen.log_dlq', 'log_dlq_queue_id_fkey');  -- databases made before 0.1.0
SELECT queen._drop_constraint('queen.log_dlq', 'log_dlq_partition_id_fkey');  -- databases made before revision 0002
-- Revision 0004: the pushing token's sub (the frame's producerSub), kept when dlq_fill copies the
-- payload out and given back to the frame a requeue writes; `sealed` holds an encrypted queue's payload
-- as the frame had it (queen_pg/security/crypto.py), with `payload` JSON null (filled): no plaintext here.
SELECT queen._add_column('queen.log_dlq', 'producer_sub', 'text');
SELECT queen._add_column('queen.log_dlq', 'sealed', 'bytea');
CREATE INDEX IF NOT EXISTS log_dlq_queue_idx ON queen.log_dlq (queue_id, consumer_group, failed_at);
CREATE INDEX IF NOT EXISTS log_dlq_partition_idx ON queen.log_dlq (partition_id, msg_offset);

-- Key-value state. `version` comes from one sequence, so it only grows (per key and globally) and
-- can serve as a fencing token: a lock permit is the row ('queen-locks', '<name>#<slot>') and its
-- token is that row's version. Expired rows (expires_at <= now) are never found and are swept by a
-- job. Writers serialize per key with the advisory lock (KV_KEY_CLASS, hashtext(tenant/ns/key)),
-- taken in ascending key order before any row is touched (docs/architecture.md#lock-order), which also covers keys
-- that do not exist yet.
CREATE SEQUENCE IF NOT EXISTS queen.kv_version_seq;
CREATE TABLE IF NOT EXISTS queen.kv (
    tenant              text NOT NULL,
    ns                  text NOT NULL,
    key                 text NOT NULL,
    value               jsonb,
    version             bigint NOT NULL,
    expires_at          timestamptz,                   -- NULL = forever
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    CONSTRAINT kv_pkey PRIMARY KEY (tenant, ns, key)
);
CREATE INDEX IF NOT EXISTS kv_expires_idx ON queen.kv (expires_at) WHERE expires_at IS NOT NULL;

-- Timers: a message scheduled into a queue. A row exists from schedule until its fire commits: firing
-- pushes it (transactionId = txn, data = payload, id = message_id) and deletes the row in the same
-- transaction, no tombstone (docs/wire.md#timers-no-tombstone). Writers serialize per key with the advisory lock
-- (TIMER_KEY_CLASS, hashtext(tenant/queue/timer_key)) in ascending key order (docs/architecture.md#lock-order).
CREATE TABLE IF NOT EXISTS queen.timers (
    tenant              text NOT NULL,
    queue               text NOT NULL,
    timer_key           text NOT NULL,
    partition           text NOT NULL DEFAULT 'Default',
    payload             bytea NOT NULL,                -- the payload as JSON text (validated by the broker)
    txn                 text NOT NULL,
    txn_hash            uuid NOT NULL,                 -- xxh3-128 of txn, for the push's dedup
    message_id          uuid NOT NULL,
    deliver_at          timestamptz NOT NULL,
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    producer_sub        text,                          -- the scheduling token's sub (JWT on), the fire's producerSub
    CONSTRAINT timers_pkey PRIMARY KEY (tenant, queue, timer_key)
);
-- Databases made before 0.2.0 kept fired timers as tombstones (fired_at): drop them and the column
-- (migrations/versions/0003_timers_no_tombstones.py does the same). Only when needed: ALTER TABLE takes
-- an ACCESS EXCLUSIVE lock, which a booting replica must not take on every boot.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = 'queen.timers'::regclass AND attname = 'fired_at' AND NOT attisdropped) THEN
        DELETE FROM queen.timers WHERE fired_at IS NOT NULL;
        DROP INDEX IF EXISTS queen.timers_fired_idx;
        DROP INDEX IF EXISTS queen.timers_due_idx;
        ALTER TABLE queen.timers DROP COLUMN fired_at;
    END IF;
END;
$$;
-- Revision 0011: the scheduler's sub (migrations/versions/0011_timers_producer_sub.py), only when missing.
SELECT queen._add_column('queen.timers', 'producer_sub', 'text');
CREATE INDEX IF NOT EXISTS timers_deliver_idx ON queen.timers (deliver_at);

-- Dead letters whose payload the dlq_fill job has not copied out of its segment yet (retention waits
-- for them; a requeue does not: it copies the segment's frame).
CREATE INDEX IF NOT EXISTS log_dlq_unfilled_idx ON queen.log_dlq (partition_id, msg_offset) WHERE payload IS NULL;

-- Operations (sql/procedures/1NN_*.sql) -----------------------------------------------------------

-- Switches every replica reads (re-read at least once a second by each broker process): e.g.
-- 'maintenance.push' and 'maintenance.pop' (jsonb booleans). Global, not per tenant.
CREATE TABLE IF NOT EXISTS queen.system_settings (
    key                 text NOT NULL,
    value               jsonb NOT NULL,
    updated_at          timestamptz NOT NULL,
    CONSTRAINT system_settings_pkey PRIMARY KEY (key)
);

-- Throughput and lag per queue and minute, written by the stats job: pushed/acked are the growth of
-- the queue's counters (sum of log_partitions.next_offset; sum of log_consumers.acked_total) since the
-- previous sample, added to the minute of the sample; backlog and lag_seconds are the last sample's.
CREATE TABLE IF NOT EXISTS queen.stats_minutes (
    queue_id            bigint NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    minute              timestamptz NOT NULL,
    tenant              text NOT NULL,
    pushed              bigint NOT NULL DEFAULT 0,
    acked               bigint NOT NULL DEFAULT 0,
    backlog             bigint NOT NULL DEFAULT 0,
    lag_seconds         double precision,                -- age of the oldest pending message; NULL: none
    CONSTRAINT stats_minutes_pkey PRIMARY KEY (queue_id, minute)
);
CREATE INDEX IF NOT EXISTS stats_minutes_minute_idx ON queen.stats_minutes (minute);
CREATE INDEX IF NOT EXISTS stats_minutes_tenant_minute_idx ON queen.stats_minutes (tenant, minute);

-- The counters each queue had at its last stats sample (the base of the next deltas).
CREATE TABLE IF NOT EXISTS queen.stats_marks (
    queue_id            bigint NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    pushed_total        bigint NOT NULL,
    acked_total         bigint NOT NULL,
    sampled_at          timestamptz NOT NULL,
    CONSTRAINT stats_marks_pkey PRIMARY KEY (queue_id)
);

-- Trace events a consumer records about a message (POST /api/v1/traces), kept for the trace
-- retention window; trace_names indexes them by name.
CREATE TABLE IF NOT EXISTS queen.traces (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant              text NOT NULL,
    partition_id        bigint NOT NULL REFERENCES queen.log_partitions (id) ON DELETE CASCADE,
    transaction_id      text NOT NULL,
    consumer_group      text NOT NULL,
    event_type          text NOT NULL,
    trace_names         text[] NOT NULL DEFAULT '{}',
    data                jsonb,
    created_at          timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS traces_message_idx ON queen.traces (partition_id, transaction_id, created_at);
CREATE INDEX IF NOT EXISTS traces_created_idx ON queen.traces (created_at);
CREATE TABLE IF NOT EXISTS queen.trace_names (
    tenant              text NOT NULL,
    name                text NOT NULL,
    created_at          timestamptz NOT NULL,
    trace_id            bigint NOT NULL REFERENCES queen.traces (id) ON DELETE CASCADE,
    CONSTRAINT trace_names_pkey PRIMARY KEY (tenant, name, created_at, trace_id)
);
CREATE INDEX IF NOT EXISTS trace_names_trace_idx ON queen.trace_names (trace_id);

-- Outcome window (sql/procedures/096_outcomes.sql) ------------------------------------------------

-- The answer of a request that carried Idempotency-Key (or X-Request-Id), written in the same
-- transaction as its effect, so a retry under the same key within the window gets it again instead of
-- applying twice, on any replica. `response` is the effect procedure's raw result (the broker renders
-- it as it did the first time); `body_hash` is xxh3-128 of the request body: the same key with another
-- body is refused (422 idempotency_key_reused). Only committed outcomes are here: a rolled-back verdict
-- wrote nothing and records nothing. Rows past expires_at are dead (never replayed) and pruned by the
-- outcomes_prune job.
CREATE TABLE IF NOT EXISTS queen.request_outcomes (
    tenant              text NOT NULL,
    request_key         text NOT NULL,
    route               text NOT NULL,
    body_hash           uuid NOT NULL,
    response            jsonb NOT NULL,
    created_at          timestamptz NOT NULL,
    expires_at          timestamptz NOT NULL,
    CONSTRAINT request_outcomes_pkey PRIMARY KEY (tenant, request_key)
);
CREATE INDEX IF NOT EXISTS request_outcomes_expires_idx ON queen.request_outcomes (expires_at);

-- Status snapshot (revision 0005; sql/procedures/098_stats_snapshot.sql) ----------------------------

-- The figures of GET /api/v1/status, /api/v1/resources/overview and the aggregated series of /metrics,
-- one row per tenant that has queues, written only by the stats_snapshot job (one replica per tick,
-- STATS_SNAPSHOT_LOCK) in one set-based pass over the tenant's rows, so a read is one primary-key probe
-- whatever the number of queues, and no push or ack writes here (no hot row). `as_of` is when the
-- figures were computed (answered as "asOf"); `took_ms` what computing them cost.
CREATE TABLE IF NOT EXISTS queen.tenant_stats (
    tenant              text NOT NULL,
    queues              bigint NOT NULL,
    partitions          bigint NOT NULL,
    messages            bigint NOT NULL,    -- every offset ever given (sum of next_offset)
    retained            bigint NOT NULL,
    backlog             bigint NOT NULL,    -- sum over queues of the queue's backlog
    in_flight           bigint NOT NULL,
    dlq                 bigint NOT NULL,
    consumer_groups     bigint NOT NULL,    -- (queue, group) pairs
    namespaces          bigint NOT NULL,
    tasks               bigint NOT NULL,
    group_lag           bigint NOT NULL,    -- sum over (queue, group) of the group's lag
    lag_seconds         double precision NOT NULL,  -- age of the oldest message some group has not done
    leased_partitions   bigint NOT NULL,    -- live leases
    acked               bigint NOT NULL,    -- sum of log_consumers.acked_total
    as_of               timestamptz NOT NULL,
    took_ms             double precision NOT NULL,
    CONSTRAINT tenant_stats_pkey PRIMARY KEY (tenant)
);

-- Throughput per tenant and minute: the sum of the tenant's stats_minutes rows of that minute, added by
-- the stats job in the same statement (GET /api/v1/status reads at most 61 rows of it, not one row per
-- queue and minute). Pruned with stats_minutes.
CREATE TABLE IF NOT EXISTS queen.tenant_minutes (
    tenant              text NOT NULL,
    minute              timestamptz NOT NULL,
    pushed              bigint NOT NULL DEFAULT 0,
    acked               bigint NOT NULL DEFAULT 0,
    CONSTRAINT tenant_minutes_pkey PRIMARY KEY (tenant, minute)
);
CREATE INDEX IF NOT EXISTS tenant_minutes_minute_idx ON queen.tenant_minutes (minute);
-- Revision 0007: the stats job samples only the queues that moved (sql/procedures/130_system.sql): each
-- queue's mark keeps its last sampled backlog and oldest pending message, and the tenant's minute row
-- their sums (backlog) and age (lag_seconds), so analytics of a whole tenant reads one row per minute.
-- Only when missing (queen._add_column).
SELECT queen._add_column('queen.stats_marks', 'backlog', 'bigint');  -- NULL: not known yet, sampled
SELECT queen._add_column('queen.stats_marks', 'oldest_at', 'timestamptz');
-- Revision 0008: sum(cursor_offset + 1) of the queue's cursors at the mark: a cursor created, deleted or moved
-- without an ack (clear, seek) changes the backlog with neither counter moving (NULL: sampled again).
SELECT queen._add_column('queen.stats_marks', 'cursors_total', 'bigint');
SELECT queen._add_column('queen.tenant_minutes', 'backlog', 'bigint');
SELECT queen._add_column('queen.tenant_minutes', 'lag_seconds', 'double precision');
-- Revision 0007: the (queue, group) pairs with a pending message, per tenant, as of the tenant's snapshot
-- (written with its tenant_stats row by the stats_snapshot job): GET /api/v1/consumer-groups/lagging
-- reads the rows old enough through the (tenant, oldest) index instead of every cursor row per call.
CREATE TABLE IF NOT EXISTS queen.group_lag (
    tenant              text NOT NULL,
    queue_id            bigint NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    consumer_group      text NOT NULL,
    queue               text NOT NULL,      -- the queue's name (a queue is never renamed)
    partitions          bigint NOT NULL,    -- cursor rows of the group in the queue
    behind              bigint NOT NULL,    -- of which with something pending
    lag                 bigint NOT NULL,    -- messages pending over them
    oldest              timestamptz NOT NULL,  -- the oldest pending message's time (head_at)
    CONSTRAINT group_lag_pkey PRIMARY KEY (tenant, queue_id, consumer_group)
);
CREATE INDEX IF NOT EXISTS group_lag_oldest_idx ON queen.group_lag (tenant, oldest, queue, consumer_group);
-- Databases that had per-queue rows before revision 0005: their tenant sums, once (while empty).
INSERT INTO queen.tenant_minutes (tenant, minute, pushed, acked)
SELECT s.tenant, s.minute, sum(s.pushed), sum(s.acked) FROM queen.stats_minutes s
 WHERE NOT EXISTS (SELECT 1 FROM queen.tenant_minutes)
 GROUP BY s.tenant, s.minute
ON CONFLICT ON CONSTRAINT tenant_minutes_pkey DO NOTHING;
