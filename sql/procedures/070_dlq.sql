-- Dead letters: list them, put one back on its queue.
--
-- queen.dlq_list_v2(tenant, queue, group, partition, from, to, limit, offset, max_bytes)
--   Called by: GET /api/v1/dlq (queen_pg/engine/dlq.py). Newest first. Result rows: the dead letter,
--   its queue and partition names, `total` (matching rows, for paging; a page past the end is one row
--   with only `total`) and, while its jsonb payload
--   is not filled yet (the dlq_fill job copies it out of the zstd segment), the segment that holds it
--   (base_offset, dropped, codec, blob) so the broker can decode it; producer_sub and sealed (filled
--   rows: the frame's producerSub, and an encrypted queue's payload still sealed; the broker opens it).
--   The page stops at the answer budget (queen_pg/engine/answers.py): a row is handed out only while
--   the bytes of the rows before it (its payload's JSON text, or its sealed bytes, or the stored bytes
--   of the segment it brings, plus its error) are under max_bytes (the first row always; NULL = no
--   limit). Locks: none (reads).
--
-- queen.dlq_requeue_v1(tenant, partition_id, txn_hash, message_id, now) -> jsonb
--   Called by: POST /api/v1/messages/{partitionId}/{transactionId}/retry (queen_pg/engine/dlq.py).
--   Appends the newest dead letter of that transactionId in that partition to the end of its
--   partition as a new message with the same transactionId, for the consumer groups that
--   dead-lettered it (the dead letters of that offset name them) and no other: every other cursor
--   row of the partition gets a log_passes row for the new offset, so those groups pass over it
--   (groups created later do receive it). The message: when the dlq_fill job has copied the payload
--   out, a raw QPF1 frame (codec 0) with a new message id (p_message_id), the dead letter's
--   producer_sub, and its payload still sealed when it was (flag 4; no plaintext); before that (the requeue
--   does not wait for the job), a copy of the segment that holds it with every other frame listed in
--   `dropped`, so it keeps its message id. Adds a hash row for the new offset (groups that have not
--   settled the original still resolve their acks to it: see log_txns) and deletes the partition's
--   dead letters of that message. Result: {"status": "requeued", "offset", "messageId", "queue",
--   "partition", "partitionId", "transactionId", "consumerGroups"} or {"status": "not_found"} or
--   {"status": "not_ready"} (payload not copied out and its segment gone: the fill job will write
--   JSON null shortly).
--   Locks (docs/architecture.md#lock-order): the log_partitions row FOR NO KEY UPDATE (#2); then the partition's cursor
--   rows FOR NO KEY UPDATE ascending (#3: the caught-up ones become pending, queen._wake_cursors; the
--   log_passes foreign key needs KEY SHARE on the others); log_dlq rows by DELETE. The clock is read
--   after the partition lock.

CREATE OR REPLACE FUNCTION queen.dlq_list_v2(
    p_tenant text, p_queue text, p_group text, p_partition text, p_from timestamptz, p_to timestamptz,
    p_limit integer, p_offset integer, p_max_bytes bigint)
RETURNS TABLE (id bigint, queue_name text, partition_name text, partition_id bigint, consumer_group text,
               msg_offset bigint, message_id uuid, transaction_id text, payload_json text, error text,
               attempts integer, created_at timestamptz, failed_at timestamptz, total bigint,
               seg_base bigint, seg_dropped integer[], seg_codec smallint, seg_blob bytea,
               producer_sub text, sealed bytea)
LANGUAGE sql STABLE AS $$
    WITH matching AS (
        SELECT d.*, q.name AS qname, p.name AS pname
          FROM queen.log_dlq d
          JOIN queen.queues q ON q.id = d.queue_id
          JOIN queen.log_partitions p ON p.id = d.partition_id
         WHERE d.tenant = p_tenant
           AND (p_queue IS NULL OR q.name = p_queue)
           AND (p_group IS NULL OR d.consumer_group = p_group)
           AND (p_partition IS NULL OR p.name = p_partition)
           AND (p_from IS NULL OR d.failed_at >= p_from)
           AND (p_to IS NULL OR d.failed_at < p_to)
    ), total AS (
        SELECT count(*) AS n FROM matching
    ), page AS (
        SELECT * FROM matching ORDER BY failed_at DESC, id DESC LIMIT p_limit OFFSET p_offset
    ), sized AS (
        -- the bytes each row brings: octet_length of a bytea reads no payload; a jsonb's text is made once
        SELECT h.*, s.base_offset AS s_base, s.dropped AS s_dropped, s.codec AS s_codec, s.payload AS s_blob,
               coalesce(sum(coalesce(octet_length(h.payload::text), octet_length(h.sealed), octet_length(s.payload), 0)
                            + coalesce(octet_length(h.error), 0))
                        OVER (ORDER BY h.failed_at DESC, h.id DESC ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                        0) AS bytes_before
          FROM page h
          LEFT JOIN LATERAL (
                SELECT s.base_offset, s.dropped, s.codec, s.payload FROM queen.log_segments s
                 WHERE h.payload IS NULL AND s.partition_id = h.partition_id AND s.base_offset <= h.msg_offset
                 ORDER BY s.base_offset DESC LIMIT 1) s ON true
    ), kept AS (
        SELECT * FROM sized WHERE p_max_bytes IS NULL OR sized.bytes_before < p_max_bytes
    )
    SELECT h.id, h.qname, h.pname, h.partition_id, h.consumer_group, h.msg_offset, h.message_id,
           h.transaction_id, h.payload::text, h.error, h.attempts, h.created_at, h.failed_at, t.n,
           h.s_base, h.s_dropped, h.s_codec, h.s_blob, h.producer_sub, h.sealed
      FROM total t
      LEFT JOIN kept h ON true
     ORDER BY h.failed_at DESC, h.id DESC;
$$;

CREATE OR REPLACE FUNCTION queen.dlq_requeue_v1(
    p_tenant text, p_partition_id bigint, p_txn_hash uuid, p_message_id uuid, p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz;
    d         queen.log_dlq%ROWTYPE;
    p         record;
    s         record;
    v_groups  text[];
    v_frames  integer;
    v_index   integer;
    v_msgid   uuid;
    v_off     bigint;
BEGIN
    SELECT dl.* INTO d FROM queen.log_dlq dl
      JOIN queen.log_txns t ON t.partition_id = dl.partition_id AND t.txn_hash = p_txn_hash
     WHERE dl.tenant = p_tenant AND dl.partition_id = p_partition_id AND dl.msg_offset = t.msg_offset
     ORDER BY dl.failed_at DESC, dl.id DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('status', 'not_found');
    END IF;

    SELECT lp.id, lp.name, lp.next_offset, lp.last_write_at, q.name AS qname INTO p
      FROM queen.log_partitions lp JOIN queen.queues q ON q.id = lp.queue_id
     WHERE lp.id = p_partition_id
       FOR NO KEY UPDATE OF lp;
    -- Re-check under the partition lock: a concurrent requeue of the same dead letter may have won
    -- while we waited; it deleted the row, and appending again would deliver the message twice.
    SELECT dl.* INTO d FROM queen.log_dlq dl WHERE dl.id = d.id;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('status', 'not_found');
    END IF;
    v_now := greatest(coalesce(p_now, clock_timestamp()), p.last_write_at);
    v_off := p.next_offset;
    v_groups := ARRAY(SELECT DISTINCT dl.consumer_group FROM queen.log_dlq dl
                       WHERE dl.partition_id = p.id AND dl.msg_offset = d.msg_offset ORDER BY 1);

    IF d.payload IS NOT NULL THEN
        v_msgid := p_message_id;
        INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, created_at, dropped, codec, payload,
                                        sealed)
        VALUES (p.id, v_off, v_off + 1, v_now, NULL, 0,
                queen._frame(v_msgid, coalesce(d.transaction_id, v_msgid::text),
                             coalesce(d.sealed, convert_to(d.payload::text, 'UTF8')), d.producer_sub),
                d.sealed IS NOT NULL);
    ELSE
        -- not copied out yet: the segment's frames as they are, all but this message's dropped
        SELECT sg.base_offset, sg.end_offset, sg.dropped, sg.codec, sg.payload, sg.sealed INTO s
          FROM queen.log_segments sg
         WHERE sg.partition_id = p.id AND sg.base_offset <= d.msg_offset
         ORDER BY sg.base_offset DESC LIMIT 1;
        IF NOT FOUND OR s.end_offset <= d.msg_offset THEN
            RETURN jsonb_build_object('status', 'not_ready');
        END IF;
        v_frames := (s.end_offset - s.base_offset)::integer + coalesce(cardinality(s.dropped), 0);
        SELECT f.i INTO v_index
          FROM generate_series(0, v_frames - 1) AS f(i)
         WHERE NOT f.i = ANY (coalesce(s.dropped, '{}'))
         ORDER BY f.i OFFSET (d.msg_offset - s.base_offset) LIMIT 1;
        v_msgid := coalesce(d.message_id, p_message_id);
        INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, created_at, dropped, codec, payload,
                                        sealed)
        VALUES (p.id, v_off, v_off + 1, v_now,
                ARRAY(SELECT f.i FROM generate_series(0, v_frames - 1) AS f(i) WHERE f.i <> v_index ORDER BY 1),
                s.codec, s.payload, s.sealed);
    END IF;
    INSERT INTO queen.log_txns AS t (partition_id, txn_hash, msg_offset, message_id, created_at)
    VALUES (p.id, p_txn_hash, v_off, v_msgid, v_now);
    UPDATE queen.log_partitions SET next_offset = v_off + 1, segments_total = segments_total + 1,
           last_write_at = v_now
     WHERE id = p.id;
    -- every cursor row of the partition at once, ascending: the wake below changes the caught-up ones
    -- and the log_passes insert takes KEY SHARE on the others (two passes would not be one order)
    PERFORM 1 FROM queen.log_consumers lc WHERE lc.partition_id = p.id
     ORDER BY lc.partition_id, lc.consumer_group FOR NO KEY UPDATE;
    PERFORM queen._wake_cursors(ARRAY[p.id], ARRAY[v_now]);
    -- only the groups that dead-lettered it receive it again
    INSERT INTO queen.log_passes (partition_id, consumer_group, msg_offset)
    SELECT lc.partition_id, lc.consumer_group, v_off
      FROM queen.log_consumers lc
     WHERE lc.partition_id = p.id AND NOT lc.consumer_group = ANY (v_groups)
     ORDER BY lc.partition_id, lc.consumer_group;
    DELETE FROM queen.log_dlq WHERE partition_id = p.id AND msg_offset = d.msg_offset;
    RETURN jsonb_build_object('status', 'requeued', 'offset', v_off, 'messageId', v_msgid,
                              'queue', p.qname, 'partition', p.name, 'partitionId', p.id::text,
                              'transactionId', d.transaction_id,
                              'consumerGroups', (SELECT jsonb_agg(queen._group_out(g) ORDER BY g)
                                                   FROM unnest(v_groups) AS g));
END;
$$;
