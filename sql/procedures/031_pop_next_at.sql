-- queen.pop_next_at_v1: when the next message of a queue becomes claimable for a consumer group,
-- if something pending is held back only by time.
--
-- Called by: the pop engine (queen_pg/engine/pop.py) when a pop woken for a queue found nothing
--          claimable: it schedules a local wake at the answer (Waiters.wake_after), so a pop parked on
--          a queue whose only message is delayed (delayedProcessing), in a windowBuffer or under an
--          unexpired lease answers when it becomes visible, not at the backed-off re-check (<= 10 s).
-- Inputs:  tenant, queue, group ('__QUEUE_MODE__' for queue mode), partition (NULL = any), p_now.
-- Result:  the soonest moment after p_now at which a partition with pending messages for the group
--          becomes claimable: max(lease expiry, head message + delayedProcessing, last write +
--          windowBuffer) over those partitions; NULL when nothing pending waits on time (empty, no
--          such queue or group yet).
-- Locks:   none (docs/architecture.md#lock-order): a plain read; a stale answer costs one needless wake or latency up to
--          the re-check, never a message. Reads the group's pending cursors only (log_consumers.head_at,
--          the time of the oldest pending message: see sql/schema.sql), so its cost follows the
--          partitions held back, not the partitions of the queue.
-- Errors:  none.

CREATE OR REPLACE FUNCTION queen.pop_next_at_v1(
    p_tenant    text,
    p_queue     text,
    p_group     text,
    p_partition text DEFAULT NULL,
    p_now       timestamptz DEFAULT NULL
) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT min(t.at)
      FROM (SELECT greatest(CASE WHEN lc.lease_id IS NOT NULL THEN lc.lease_expires_at END,
                            CASE WHEN qq.delayed_processing > 0
                                 THEN lc.head_at + make_interval(secs => qq.delayed_processing) END,
                            CASE WHEN qq.window_buffer > 0
                                 THEN p.last_write_at + make_interval(secs => qq.window_buffer) END) AS at
              FROM queen.queues qq
              -- pending cursors only (head_at set), through log_consumers_ready_idx: the caught-up
              -- partitions of the group are never visited
              JOIN queen.log_consumers lc ON lc.queue_id = qq.id AND lc.consumer_group = p_group
                                         AND lc.head_at IS NOT NULL
              JOIN queen.log_partitions p ON p.id = lc.partition_id
             WHERE qq.tenant = p_tenant AND qq.name = p_queue
               AND (p_partition IS NULL OR p.name = p_partition)
               AND lc.cursor_offset < p.next_offset) t
     WHERE t.at > coalesce(p_now, now());
$$;
