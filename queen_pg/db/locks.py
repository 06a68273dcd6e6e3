"""Advisory-lock keys, mirrored from docs/architecture.md#advisory-keys (one named constant per key)."""

APPLY_LOCK = 7_781_200_001

# Background jobs (queen_pg/jobs): leadership per tick, pg_try_advisory_xact_lock in the procedure.
LEASE_EXPIRY_LOCK = 7_781_200_101
RETENTION_LOCK = 7_781_200_102
DLQ_FILL_LOCK = 7_781_200_103

# KV keys: two-int advisory locks pg_advisory_xact_lock(KV_KEY_CLASS, hashtext(tenant/ns/key)), one per
# key, in ascending hash order (queen._kv_lock, sql/procedures/080_kv.sql); level 0 of the lock order.
KV_KEY_CLASS = 77_812
KV_SWEEP_LOCK = 7_781_200_180  # queen.kv_sweep_v1 (job kv_sweep): one replica per tick

# Timer keys: two-int advisory locks (TIMER_KEY_CLASS, hashtext(tenant/queue/timer_key)), one per key,
# ascending hash order (queen._timer_lock, sql/procedures/086_timers.sql); level 0b of the lock order.
# Writers take them exclusive; the firing job takes them shared (try), see docs/architecture.md#advisory-keys.
TIMER_KEY_CLASS = 77_813
TIMERS_FIRE_LOCK = 7_781_200_186  # queen.timers_fire_v1 (job timers): one replica per tick

# Request keys of the outcome window: two-int advisory lock (REQUEST_KEY_CLASS, hashtext(tenant/key)),
# taken by the _v2 procedures before any other lock (sql/procedures/096_outcomes.sql); level -1.
REQUEST_KEY_CLASS = 77_814
OUTCOMES_PRUNE_LOCK = 7_781_200_196  # queen.outcomes_prune_v1 (job outcomes_prune): one replica per tick

# Operations jobs (sql/procedures/130_system.sql, 120_traces.sql): one replica per tick.
STATS_LOCK = 7_781_200_170  # queen.stats_sample_v1 (job stats)
TRACES_RETENTION_LOCK = 7_781_200_171  # queen.traces_retention_v1 (job trace_retention)
STATS_SNAPSHOT_LOCK = 7_781_200_172  # queen.stats_snapshot_v1 (job stats_snapshot)
