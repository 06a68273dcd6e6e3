-- Dead letters: list them, put one back on its queue.
--
-- queen.dlq_list_v1(tenant, queue, group, partition, from, to, limit, offset)
--   Called by: GET /api/v1/dlq (queen_pg/engine/dlq.py). Newest first. Result rows: the dead letter,
--   its queue and partition names, `total` (matching rows, for paging; a page past the end is one row
--   with only `total`) and, while its jsonb payload
--   is not filled yet (the dlq_fill job copies it out of the zstd segment), the segment that holds it
--   (base_offset, dropped, codec, blob) so the broker can decode it. Locks: none (reads).
--
-- queen.dlq_requeue_v1(tenant, partition_id, txn_hash, message_id, now) -> jsonb
--   Called by: POST /api/v1/messages/{partitionId}/{transactionId}/retry. Appends the newest dead
--   letter of that transactionId in that partition to the end of its partition as a new message
--   (same transactionId, new message id, payload from the DLQ row, written as a raw QPF1 frame,
--   codec 0), adds a hash row for the new offset (groups that have not settled the original still
--   resolve their acks to it: see log_txns), and deletes the partition's dead letters
--   of that message. Every group of the queue receives it again. Result: {"status": "requeued",
--   "offset", "messageId", "queue", "partition", "partitionId"} or {"status": "not_found"} or
--   {"status": "not_ready"} (payload not copied out yet: retry in a moment).
--   Locks (docs/locks.md): the log_partitions row FOR NO KEY UPDATE; log_dlq rows by DELETE.

CREATE OR REPLACE FUNCTION queen.dlq_list_v1(
    p_tenant text, p_queue text, p_group text, p_partition text, p_from timestamptz, p_to timestamptz,
    p_limit integer, p_offset integer)
RETURNS TABLE (id bigint, queue_name text, partition_name text, partition_id bigint, consumer_group text,
               msg_offset bigint, message_id uuid, transaction_id text, payload_json text, error text,
               attempts integer, created_at timestamptz, failed_at timestamptz, total bigint,
               seg_base bigint, seg_dropped integer[], seg_codec smallint, seg_blob bytea)
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
    )
    SELECT h.id, h.qname, h.pname, h.partition_id, h.consumer_group, h.msg_offset, h.message_id,
           h.transaction_id, h.payload::text, h.error, h.attempts, h.created_at, h.failed_at, t.n,
           s.base_offset, s.dropped, s.codec, s.payload
      FROM total t
      LEFT JOIN page h ON true
      LEFT JOIN LATERAL (
            SELECT s.base_offset, s.dropped, s.codec, s.payload FROM queen.log_segments s
             WHERE h.payload IS NULL AND s.partition_id = h.partition_id AND s.base_offset <= h.msg_offset
             ORDER BY s.base_offset DESC LIMIT 1) s ON true
     ORDER BY h.failed_at DESC, h.id DESC;
$$;

CREATE OR REPLACE FUNCTION queen.dlq_requeue_v1(
    p_tenant text, p_partition_id bigint, p_txn_hash uuid, p_message_id uuid, p_now timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now   timestamptz;
    d       queen.log_dlq%ROWTYPE;
    p       record;
    v_frame bytea;
    v_off   bigint;
BEGIN
    SELECT dl.* INTO d FROM queen.log_dlq dl
      JOIN queen.log_txns t ON t.partition_id = dl.partition_id AND t.txn_hash = p_txn_hash
     WHERE dl.tenant = p_tenant AND dl.partition_id = p_partition_id AND dl.msg_offset = t.msg_offset
     ORDER BY dl.failed_at DESC, dl.id DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('status', 'not_found');
    END IF;
    IF d.payload IS NULL THEN
        RETURN jsonb_build_object('status', 'not_ready');
    END IF;

    SELECT lp.id, lp.name, lp.next_offset, lp.last_write_at, q.name AS qname INTO p
      FROM queen.log_partitions lp JOIN queen.queues q ON q.id = lp.queue_id
     WHERE lp.id = p_partition_id
       FOR NO KEY UPDATE OF lp;
    -- Re-check under the partition lock: a concurrent requeue of the same dead letter may have won
    -- while we waited; it deleted the row, and appending again would deliver the message twice.
    IF NOT EXISTS (SELECT 1 FROM queen.log_dlq dl WHERE dl.id = d.id) THEN
        RETURN jsonb_build_object('status', 'not_found');
    END IF;
    v_now := greatest(coalesce(p_now, clock_timestamp()), p.last_write_at);
    v_off := p.next_offset;
    v_frame := queen._frame(p_message_id, coalesce(d.transaction_id, p_message_id::text),
                            convert_to(d.payload::text, 'UTF8'));
    INSERT INTO queen.log_segments (partition_id, base_offset, end_offset, created_at, dropped, codec, payload)
    VALUES (p.id, v_off, v_off + 1, v_now, NULL, 0, v_frame);
    INSERT INTO queen.log_txns AS t (partition_id, txn_hash, msg_offset, message_id, created_at)
    VALUES (p.id, p_txn_hash, v_off, p_message_id, v_now);
    UPDATE queen.log_partitions SET next_offset = v_off + 1, segments_total = segments_total + 1,
           last_write_at = v_now
     WHERE id = p.id;
    DELETE FROM queen.log_dlq WHERE partition_id = p.id AND msg_offset = d.msg_offset;
    RETURN jsonb_build_object('status', 'requeued', 'offset', v_off, 'messageId', p_message_id,
                              'queue', p.qname, 'partition', p.name, 'partitionId', p.id::text,
                              'transactionId', d.transaction_id);
END;
$$;
