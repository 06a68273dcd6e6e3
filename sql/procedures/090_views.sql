-- Operator views: the broker's state readable with psql alone, e.g.
--
--   psql ... -c 'SELECT * FROM queen.v_queues'
--   psql ... -c "SELECT * FROM queen.v_partitions WHERE queue = 'orders' AND lag > 0 ORDER BY lag DESC"
--   psql ... -c 'SELECT * FROM queen.v_consumer_groups ORDER BY total_lag DESC'
--   psql ... -c "SELECT * FROM queen.v_dlq WHERE queue = 'orders' ORDER BY failed_at DESC LIMIT 20"
--
-- Not called by the broker; nothing here locks anything (plain reads under MVCC).
--
-- Message payloads: a message lives inside a zstd-compressed segment (log_segments.payload, QPF1
-- frames), which psql cannot read. Read messages through the API (pop, or the admin routes); the only
-- payloads shown here are the dead letters' `payload` column of v_dlq, when the broker filled it.
--
-- Conventions: queue mode (the group '__QUEUE_MODE__') shows as consumer_group NULL, queue_mode true
-- (queen._group_out, queen._queue_mode: 001_internal.sql).
-- lag = next_offset - cursor_offset (messages not yet done for the group; offsets it passes over,
-- queen.log_passes, above the cursor still count). A lease is live while lease_expires_at > now() (the transaction's
-- start time). The counts are exact and computed on each read: on very large queues v_queues
-- (retained_segments counts segment rows) is a scan, so filter by queue when it matters.
--
-- Applied at every boot: CREATE OR REPLACE VIEW is idempotent but can only append columns. A view
-- whose columns change or move is dropped first (DROP VIEW IF EXISTS) in the same change.

-- One row per queue.
CREATE OR REPLACE VIEW queen.v_queues AS
SELECT q.tenant,
       q.name                                   AS queue,
       q.namespace,
       q.task,
       p.partitions,
       p.messages_written,                      -- every offset ever given (sum of next_offset)
       s.retained_segments,
       g.groups,                                -- consumer groups, queue mode included
       b.backlog,                               -- the most lagging group's total lag; NULL: no group yet
       l.leased_partitions,                     -- partitions with a live lease in any group
       d.dlq_size,
       q.lease_time,
       q.retry_limit,
       q.delayed_processing,
       q.dedup_window_seconds,
       q.retention_seconds,
       q.completed_retention_seconds,
       q.created_at
  FROM queen.queues q
 CROSS JOIN LATERAL (
       SELECT count(*) AS partitions, coalesce(sum(lp.next_offset), 0)::bigint AS messages_written
         FROM queen.log_partitions lp WHERE lp.queue_id = q.id) p
 CROSS JOIN LATERAL (
       SELECT count(*) AS retained_segments
         FROM queen.log_partitions lp JOIN queen.log_segments ls ON ls.partition_id = lp.id
        WHERE lp.queue_id = q.id) s
 CROSS JOIN LATERAL (
       SELECT count(*) AS groups FROM queen.log_groups lg WHERE lg.queue_id = q.id) g
 CROSS JOIN LATERAL (
       SELECT max(per_group.lag)::bigint AS backlog
         FROM (SELECT sum(lp.next_offset - lc.cursor_offset) AS lag
                 FROM queen.log_consumers lc JOIN queen.log_partitions lp ON lp.id = lc.partition_id
                WHERE lc.queue_id = q.id
                GROUP BY lc.consumer_group) per_group) b
 CROSS JOIN LATERAL (
       SELECT count(DISTINCT lc.partition_id) AS leased_partitions
         FROM queen.log_consumers lc
        WHERE lc.queue_id = q.id AND lc.lease_id IS NOT NULL AND lc.lease_expires_at > now()) l
 CROSS JOIN LATERAL (
       SELECT count(*) AS dlq_size FROM queen.log_dlq dq WHERE dq.queue_id = q.id) d;

-- One row per (partition, group); a partition no group reads yet shows once, with NULL cursor columns.
CREATE OR REPLACE VIEW queen.v_partitions AS
SELECT lp.tenant,
       q.name                                           AS queue,
       lp.name                                          AS partition,
       lp.id                                            AS partition_id,
       lp.next_offset,
       queen._group_out(lc.consumer_group)              AS consumer_group,
       queen._queue_mode(lc.consumer_group)             AS queue_mode,
       lc.cursor_offset,
       lp.next_offset - lc.cursor_offset                AS lag,
       '{}'::bigint[]                                   AS acked_ahead,  -- always empty: an ack is an offset commit
       lc.lease_id,
       lc.lease_expires_at,
       lc.lease_end,
       lc.lease_id IS NOT NULL AND lc.lease_expires_at > now() AS lease_live,
       lc.attempts                                      AS delivery_attempts,
       lc.acked_total,
       lp.last_write_at                                 AS last_write
  FROM queen.log_partitions lp
  JOIN queen.queues q ON q.id = lp.queue_id
  LEFT JOIN queen.log_consumers lc ON lc.partition_id = lp.id;

-- One row per (queue, group).
CREATE OR REPLACE VIEW queen.v_consumer_groups AS
SELECT q.tenant,
       q.name                                           AS queue,
       queen._group_out(lg.name)                        AS consumer_group,
       queen._queue_mode(lg.name)                       AS queue_mode,
       lg.subscription_mode,
       lg.subscribed_from,
       c.partitions,
       c.total_lag,
       c.leased_partitions,
       c.oldest_pending_at,  -- time of the oldest message not yet done (NULL: no lag)
       lg.created_at
  FROM queen.log_groups lg
  JOIN queen.queues q ON q.id = lg.queue_id
 CROSS JOIN LATERAL (
       SELECT count(*)                                                   AS partitions,
              coalesce(sum(lp.next_offset - lc.cursor_offset), 0)::bigint AS total_lag,
              count(*) FILTER (WHERE lc.lease_id IS NOT NULL AND lc.lease_expires_at > now())
                                                                         AS leased_partitions,
              min((SELECT ls.created_at FROM queen.log_segments ls
                    WHERE ls.partition_id = lc.partition_id AND ls.base_offset <= lc.cursor_offset
                    ORDER BY ls.base_offset DESC LIMIT 1))
                  FILTER (WHERE lc.cursor_offset < lp.next_offset)       AS oldest_pending_at
         FROM queen.log_consumers lc
         JOIN queen.log_partitions lp ON lp.id = lc.partition_id
        WHERE lc.queue_id = lg.queue_id AND lc.consumer_group = lg.name) c;

-- One row per dead letter.
CREATE OR REPLACE VIEW queen.v_dlq AS
SELECT dq.tenant,
       q.name                                           AS queue,
       lp.name                                          AS partition,
       queen._group_out(dq.consumer_group)              AS consumer_group,
       queen._queue_mode(dq.consumer_group)             AS queue_mode,
       dq.msg_offset,
       dq.transaction_id,
       dq.message_id,
       dq.payload,
       dq.error,
       dq.attempts,
       dq.created_at,                                   -- when the message was pushed
       dq.failed_at,
       dq.id                                            AS dlq_id
  FROM queen.log_dlq dq
  JOIN queen.queues q ON q.id = dq.queue_id
  JOIN queen.log_partitions lp ON lp.id = dq.partition_id;
