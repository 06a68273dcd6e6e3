-- queen.lease_release_v1: give a lease back at once, as if its claim had never happened, when the pop
-- answer carrying it could not be delivered (the client went away while the claim ran).
--
-- Called by: the pop routes through queen_pg/engine/pop.py (release()), only for a claim whose client
--          disconnected before the answer was sent; never by clients (they do not know such a lease).
-- Inputs:  tenant; group ('__QUEUE_MODE__' for queue mode); the lease id the broker minted for the pop;
--          per claimed partition, as queen.pop_v1 returned them: partition id, lease_start (the cursor
--          at the claim), lease_end, redelivered_end and attempts.
-- Result:  the number of cursor rows released; 0 when the lease is no longer held under that id (it
--          expired and was claimed again), which leaves everything as it is.
-- Locks:   (docs/architecture.md#lock-order) log_consumers rows FOR UPDATE, ascending (partition_id, consumer_group)
--          (#3); nothing else.
-- Guarantees: only rows still held under p_lease_id change: lease_id, lease_expires_at and lease_end
--          become NULL, and the delivery the claim counted is taken back (delivered_end and attempts
--          as they were before it, derived from what pop_v1 returned), so the next consumer gets the
--          messages at once and as the same delivery attempt. The cursor, acked offsets and retry
--          budget are untouched (pop_v1 without autoAck does not change them). Reads no clock.
-- Errors:  none.

CREATE OR REPLACE FUNCTION queen.lease_release_v1(
    p_tenant           text,
    p_group            text,
    p_lease_id         uuid,
    p_partition_ids    bigint[],
    p_lease_starts     bigint[],
    p_lease_ends       bigint[],
    p_redelivered_ends bigint[],
    p_attempts         integer[]
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_released integer;
BEGIN
    WITH claims AS (
        SELECT * FROM unnest(p_partition_ids, p_lease_starts, p_lease_ends, p_redelivered_ends, p_attempts)
                   AS t(partition_id, lease_start, lease_end, redelivered_end, attempt)
    ), held AS (
        SELECT lc.partition_id
          FROM queen.log_consumers lc
          JOIN claims c ON c.partition_id = lc.partition_id
         WHERE lc.consumer_group = p_group AND lc.tenant = p_tenant AND lc.lease_id = p_lease_id
         ORDER BY lc.partition_id
           FOR UPDATE OF lc
    ), released AS (
        UPDATE queen.log_consumers lc
           SET lease_id = NULL, lease_expires_at = NULL, lease_end = NULL,
               -- pop_v1 set delivered_end = greatest(before, lease_end) and returned
               -- redelivered_end = least(before, lease_end): below lease_end it IS the value before
               delivered_end = CASE WHEN c.redelivered_end < c.lease_end THEN c.redelivered_end
                                    ELSE lc.delivered_end END,
               -- a redelivery (cursor below delivered_end) counted attempts + 1; a first delivery 1
               attempts = CASE WHEN c.redelivered_end > c.lease_start THEN greatest(c.attempt - 1, 0)
                               ELSE 0 END
          FROM held h
          JOIN claims c ON c.partition_id = h.partition_id
         WHERE lc.partition_id = h.partition_id AND lc.consumer_group = p_group
           AND lc.lease_id = p_lease_id
        RETURNING 1
    )
    SELECT count(*)::integer INTO v_released FROM released;
    RETURN v_released;
END;
$$;
