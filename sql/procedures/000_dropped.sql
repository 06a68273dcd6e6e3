-- Procedures that are gone: the one place where sql/ drops functions. Runs first among the procedure
-- files (after schema.sql), so each file below creates its procedures into a catalog free of their old
-- shapes (an old overload left beside a new one makes calls ambiguous).
--
-- Policy (STYLE "SQL", CHANGELOG.md): 0.1.0 is the first released set of procedures. Until it, nothing
-- was released, so no rolling deploy calls an old version: every superseded version and every procedure
-- without a caller was dropped here at the release boundary (tests/test_sql_callers.py keeps it so:
-- every procedure of sql/ has a caller). After 0.1.0 a changed signature ships as the next _vN, and the
-- old one is dropped here one release later, when no broker of the previous release calls it.
-- A line stays as long as a database may still hold what it drops: a database set up by an earlier boot
-- loses it at its next boot (tests/test_migrations.py boots a database holding every one of them).
-- Migrations do not drop functions (migrations/versions/0001_baseline.py): boot and the baseline both
-- apply this file.

-- At the release boundary (0.1.0): superseded versions and procedures nothing called.
DROP FUNCTION IF EXISTS queen.kv_v1(text, jsonb, timestamptz);                       -- kv_v3
DROP FUNCTION IF EXISTS queen.kv_v2(text, jsonb, timestamptz, text, text, uuid, integer);  -- kv_v3
DROP FUNCTION IF EXISTS queen.kv_keys_v1(text, text, text, text, integer, boolean, timestamptz);  -- kv_keys_v2
DROP FUNCTION IF EXISTS queen._kv_get_many(text, text, jsonb, timestamptz);           -- the 5-argument form
DROP FUNCTION IF EXISTS queen._kv_get_prefix(text, jsonb, timestamptz);               -- the 4-argument form
DROP FUNCTION IF EXISTS queen.dlq_fill_v1(bigint[], text[], integer, timestamptz);    -- dlq_fill_v2
DROP FUNCTION IF EXISTS queen.dlq_list_v1(text, text, text, text, timestamptz, timestamptz, integer, integer);  -- v2
DROP FUNCTION IF EXISTS queen.message_get_v1(text, bigint, uuid, timestamptz);        -- message_get_v2
DROP FUNCTION IF EXISTS queen.messages_list_v1(text, text, text, bigint, bigint, timestamptz, timestamptz, boolean,
                                               text, integer, integer, timestamptz);  -- messages_list_v3
DROP FUNCTION IF EXISTS queen.messages_list_v2(text, text, text, bigint, bigint, timestamptz, timestamptz, boolean,
                                               text, integer, integer, text, timestamptz);  -- messages_list_v3
DROP FUNCTION IF EXISTS queen.traces_for_message_v1(text, bigint, text, integer, integer);  -- v2
DROP FUNCTION IF EXISTS queen.traces_by_name_v1(text, text, timestamptz, timestamptz, integer, integer);  -- v2
DROP FUNCTION IF EXISTS queen.metrics_snapshot_v1(timestamptz);             -- metrics_tenants_v1, metrics_queues_v1
DROP FUNCTION IF EXISTS queen.metrics_partition_queues_v1(bigint[]);        -- no caller
DROP FUNCTION IF EXISTS queen.timer_get_v1(text, text, text);               -- timer_get_v2 (read fired_at)

-- Earlier shapes of kept procedures, from builds before 0.1.0 (a signature changed in place): dropped so
-- that no call is ambiguous. They can go at the next release: every database at 0.1.0 has run them.
DROP FUNCTION IF EXISTS queen._frame(uuid, text, bytea);
DROP FUNCTION IF EXISTS queen.push_v1(text, text[], text[], bytea[], integer[], uuid[], uuid[], timestamptz);
DROP FUNCTION IF EXISTS queen.push_v1(text, text[], text[], bytea[], integer[], uuid[], uuid[], timestamptz,
                                      smallint[]);
DROP FUNCTION IF EXISTS queen.push_v2(text, text[], text[], bytea[], integer[], uuid[], uuid[], timestamptz, text,
                                      text, uuid, integer);
DROP FUNCTION IF EXISTS queen.pop_v1(text, text, text, text, integer, integer, uuid, boolean, text,
                                     timestamptz, timestamptz);
DROP FUNCTION IF EXISTS queen.pop_v1(text, text, text, text, text, text, integer, integer, uuid, boolean, text,
                                     timestamptz, timestamptz);
DROP FUNCTION IF EXISTS queen._ack_settle(text, bigint[], uuid[], text[], uuid[], text[], text[], text[], timestamptz);
DROP FUNCTION IF EXISTS queen._ack_settle(text, bigint[], uuid[], text[], uuid[], text[], text[], text[], timestamptz,
                                          bytea, bytea);
DROP FUNCTION IF EXISTS queen._ack_settle(text, bigint[], uuid[], text[], uuid[], text[], text[], text[], timestamptz,
                                          bytea, bytea, boolean);
DROP FUNCTION IF EXISTS queen._ack_settle(text, bigint[], uuid[], text[], uuid[], text[], text[], text[], timestamptz,
                                          bytea, bytea, boolean, bigint[]);
DROP FUNCTION IF EXISTS queen.ack_v3(text, bigint[], uuid[], text[], uuid[], text[], text[], text[], timestamptz);
DROP FUNCTION IF EXISTS queen.ack_v3(text, bytea, bigint[], text[], uuid[], text[], bytea, text[], timestamptz);
-- ack_v3 gained the o_wake column with the same arguments (CREATE OR REPLACE cannot change a result
-- type): the shape without it goes.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_proc WHERE oid = to_regprocedure(
                 'queen.ack_v3(text, bytea, bigint[], text[], uuid[], text[], bytea, text[], timestamptz, bigint[])')
                 AND NOT ('o_wake' = ANY (proargnames))) THEN
        DROP FUNCTION queen.ack_v3(text, bytea, bigint[], text[], uuid[], text[], bytea, text[], timestamptz, bigint[]);
    END IF;
END;
$$;
-- messages_list_v3 answers each message's state (`states`) in place of the cursor, passes, lease end
-- and dead letters the broker judged them from: the shape without it goes.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_proc WHERE oid = to_regprocedure(
                 'queen.messages_list_v3(text, text, text, bigint, bigint, timestamptz, timestamptz, boolean, text,'
                 ' integer, integer, text, timestamptz, bigint)')
                 AND NOT ('states' = ANY (proargnames))) THEN
        DROP FUNCTION queen.messages_list_v3(text, text, text, bigint, bigint, timestamptz, timestamptz, boolean,
                                             text, integer, integer, text, timestamptz, bigint);
    END IF;
END;
$$;
DROP FUNCTION IF EXISTS queen._tx_ack_refusal(text, bigint, uuid, uuid, text, timestamptz);
DROP FUNCTION IF EXISTS queen.transaction_v1(text, bigint[], uuid[], text[], uuid[], text[], text[], integer[],
    uuid[], text[], text[], bytea[], integer[], uuid[], uuid[], integer[], text[], jsonb, integer, jsonb, bytea[],
    uuid[], uuid[], integer, timestamptz);
DROP FUNCTION IF EXISTS queen.transaction_v1(text, bigint[], uuid[], text[], uuid[], text[], text[], integer[],
    uuid[], text[], text[], bytea[], integer[], uuid[], uuid[], integer[], text[], jsonb, integer, jsonb, bytea[],
    uuid[], uuid[], integer, timestamptz, boolean[]);
DROP FUNCTION IF EXISTS queen.transaction_v2(text, bigint[], uuid[], text[], uuid[], text[], text[], integer[],
    uuid[], text[], text[], bytea[], integer[], uuid[], uuid[], integer[], text[], jsonb, integer, jsonb, bytea[],
    uuid[], uuid[], integer, timestamptz, text, text, uuid, integer, text);
DROP FUNCTION IF EXISTS queen.transaction_v2(text, bigint[], uuid[], text[], uuid[], text[], text[], integer[],
    uuid[], text[], text[], bytea[], integer[], uuid[], uuid[], integer[], text[], jsonb, integer, jsonb, bytea[],
    uuid[], uuid[], integer, timestamptz, text, text, uuid, integer, text, boolean[]);
-- Internal helpers replaced (no caller outside sql/): the outcome window's find and record became
-- _outcome_open (with the time it judges at) and _outcome_keep (returns what it records), so each wrapper
-- of 096_outcomes.sql states the rule as one statement.
DROP FUNCTION IF EXISTS queen._outcome_find(text, text, text, uuid, timestamptz);
DROP FUNCTION IF EXISTS queen._outcome_record(text, text, text, uuid, jsonb, integer, timestamptz);
