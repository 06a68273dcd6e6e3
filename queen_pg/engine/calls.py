"""Every stored-procedure call the broker sends, by feature: the SQL text of each call, in one place.

An entry is written by :func:`call` from the procedure's name and its arguments: a count ``n`` gives
``$1, ..., $n``; an argument list with a cast or a literal (``$2::text::jsonb``, a ``NULL`` for an
argument the broker leaves to the database: mostly ``p_now``, the clock) is written out. :func:`call`
records each entry's procedure and argument count in :data:`CALLS`; ``tests/test_sql_callers.py``
checks them against ``pg_proc`` of a database with ``sql/`` applied (the procedure exists in schema
``queen`` and takes that many arguments; a written-out list numbers its parameters ``$1`` to ``$k`` in
order; PostgreSQL prepares the text) and that no other module of ``queen_pg`` sends a SQL text that
calls a procedure. The engine modules and jobs make the calls.

The texts are the statements asyncpg prepares and caches by their text: the same call is always the
same text.
"""

from __future__ import annotations

from typing import Final

CALLS: Final[dict[str, tuple[str, int]]] = {}  # SQL text -> (procedure in schema queen, arguments passed)


def call(name: str, args: int | str, select: str | None = None, alias: str | None = None) -> str:
    """``SELECT queen.<name>(<args>)``; with ``select``, ``SELECT <select> FROM queen.<name>(<args>)``
    (``"*"`` for a procedure that returns a set), named ``alias`` when the select list needs it."""
    listed = args if isinstance(args, str) else ", ".join(f"${i}" for i in range(1, args + 1))
    expr = f"queen.{name}({listed})"
    sql = f"SELECT {expr}" if select is None else f"SELECT {select} FROM {expr}"
    if alias is not None:
        sql += f" AS {alias}"
    CALLS[sql] = (name, len(listed.split(", ")) if listed else 0)
    return sql


# Push (sql/procedures/020_push.sql); a request with a key: push_v2 keeps its outcome (096_outcomes.sql)
PUSH = call("push_v3", "$1, $2, $3, $4, $5, $6, $7, NULL, NULL, $8", "*")
PUSH_ONCE = call("push_v2", "$1, $2, $3, $4, $5, $6, $7, NULL, $8, $9, $10, $11, $12", "*")

# Pop (030_pop.sql, 031_pop_next_at.sql, 045_lease_release.sql). A framed pop on a broker holding keys
# also reads each segment's `sealed` (revision 0012), by key, so that it decodes only segments that may
# hold sealed frames (sealing.opened_rows). The lookup reads the statement's snapshot, taken before
# pop_v1's own statements: a segment committed in between is not seen there, its NULL reads as "may be
# sealed" and it is decoded, so a sealed frame is never shipped.
_POP_ARGS = "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, NULL, $13"
_SEALED = (
    "p.*, (SELECT s.sealed FROM queen.log_segments s"
    " WHERE s.partition_id = p.partition_id AND s.base_offset = p.base_offset) AS sealed"
)
POP = call("pop_v1", _POP_ARGS, "*")
POP_SEALED = call("pop_v1", _POP_ARGS, _SEALED, "p")
# several consumer groups' pops of one queue in one call (request fusion: engine.pop.pop_many)
POP_MANY = call("pop_many_v1", 11, "p.*", "p")
POP_MANY_SEALED = call("pop_many_v1", 11, _SEALED, "p")
LEASE_RELEASE = call("lease_release_v1", 8)
POP_NEXT_AT = call("pop_next_at_v1", 4)

# Ack (040_ack.sql). ack_v3: the items packed (engine.ack.Packed), $9 the lease book's hint
# (engine/leases.py) or NULL; one row of sparse verdicts (1-based indexes): refused + their errors,
# leaseReleased, dlq, noop; and the queues whose parked pops to wake (a cursor row left claimable: its
# lease released with messages left, a nack). ack_v1 takes more kinds than ack_v3's u16 holds; ack_v2
# keeps its outcome for a request key (096_outcomes.sql); after either, _ack_wakes names the queues to
# wake (ack_v3 answers it itself).
_ACK_VERDICTS = "o_refused, o_errors, o_released, o_dlq, o_noop, o_wake"
ACK = call("ack_v3", "$1, $2, $3, $4, $5, $6, $7, $8, NULL, $9", _ACK_VERDICTS)
ACK_ROWS = call("ack_v1", 8, "*")
ACK_ONCE = call("ack_v2", "$1, $2, $3, $4, $5, $6, $7, $8, NULL, $9, $10, $11, $12", "*")
ACK_WAKES = call("_ack_wakes", 3)
LEASE_EXTEND = call("lease_extend_v1", 2, "*")

# Transaction (095_transaction.sql): the KV and timer operations as JSON text; v2 keeps its outcome
# (096_outcomes.sql)
_TX_ARGS = (
    "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,"
    " $18::text::jsonb, $19, $20::text::jsonb, $21, $22, $23, $24, NULL, $25, $26"
)
TRANSACTION = call("transaction_v1", _TX_ARGS)
TRANSACTION_ONCE = call("transaction_v2", _TX_ARGS + ", $27, $28, $29, $30, $31", "*")

# KV and locks: the operations as JSON text (kv_v3 and locks_v2 keep their outcome: 096_outcomes.sql;
# the browse: 081_kv_browse.sql; locks_v1: 085_locks.sql)
KV = call("kv_v3", "$1, $2::text::jsonb, $3, $4, $5, $6, $7, $8", "*")
KV_NAMESPACES = call("kv_namespaces_v1", 3, "ns")
KV_KEYS = call("kv_keys_v2", 8)
LOCKS = call("locks_v1", "$1, $2::text::jsonb, $3")
LOCKS_ONCE = call("locks_v2", "$1, $2::text::jsonb, $3, $4, $5, $6, $7", "*")

# Timers (086_timers.sql): the operations as JSON text
TIMERS = call("timers_v1", "$1, $2::text::jsonb, $3, $4, $5, $6")
TIMER_CANCEL = call("timer_cancel_v1", 5)
TIMER_GET = call("timer_get_v2", 3, "*")
TIMER_LIST = call("timer_list_v2", 5)
TIMERS_FIRE = call("timers_fire_v1", 2)

# Queues (010_queue.sql): the options as JSON text
CONFIGURE_QUEUE = call("configure_queue_v2", "$1, $2, $3, $4, $5::text::jsonb, $6")
DELETE_QUEUE = call("delete_queue_v1", 2)

# Messages, dead letters and the admin moves (110_messages.sql, 070_dlq.sql, 075_admin_clear.sql)
MESSAGES_LIST = call("messages_list_v3", "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, NULL, $13", "*")
MESSAGE_GET = call("message_get_v2", 3, "*")
MESSAGE_DELETE = call("message_delete_v1", 3)
MESSAGE_DLQ = call("message_dlq_v1", 6)
QUEUE_CLEAR = call("queue_clear_v1", 3)
DLQ_LIST = call("dlq_list_v2", 9, "*")
DLQ_REQUEUE = call("dlq_requeue_v1", 4)

# Consumer groups (050_groups.sql; the lagging ones: 140_status.sql)
GROUPS_LIST = call("consumer_groups_list_v1", 3)
GROUP_GET = call("consumer_group_get_v1", 2)
GROUP_DELETE = call("consumer_group_delete_v1", 4)
GROUP_SEEK = call("consumer_group_seek_v1", 6)
GROUP_SUBSCRIPTION = call("consumer_group_subscription_v1", 3)
GROUPS_LAGGING = call("consumer_groups_lagging_v1", 4)

# Resources and status (100_resources.sql, 140_status.sql); a tenant's snapshot refreshed now (limit 1,
# no minimum gap, the database's clock, that tenant: 098_stats_snapshot.sql), then the time of its
# tenant_stats row (a read, no procedure call)
RESOURCES_OVERVIEW = call("resources_overview_v1", 1)
RESOURCES_QUEUES = call("resources_queues_v1", 6)
RESOURCES_QUEUE = call("resources_queue_v1", 4)
RESOURCES_QUEUE_DEPTH = call("resources_queue_depth_v1", 5)
RESOURCES_PARTITIONS = call("resources_partitions_v1", 4)
RESOURCES_TAGS = call("resources_tags_v1", 4)
STATUS = call("status_v1", 1)
STATUS_QUEUES = call("status_queues_v1", 5)
STATUS_QUEUE = call("status_queue_v1", 5)
ANALYTICS = call("analytics_v1", 5)
TENANT_SNAPSHOT = call("stats_snapshot_v1", "1, 0, NULL, $1")
TENANT_SNAPSHOT_AS_OF = "SELECT queen._iso_utc(s.as_of) FROM queen.tenant_stats s WHERE s.tenant = $1"

# Traces (120_traces.sql)
TRACE_ADD = call("trace_add_v1", 7)
TRACES_FOR_MESSAGE = call("traces_for_message_v2", 6)
TRACES_BY_NAME = call("traces_by_name_v2", 7)
TRACE_NAMES = call("trace_names_v1", 4)

# Metrics (097_metrics.sql, 098_stats_snapshot.sql); the count of a tenant's queues (or all queues) is a
# read, no procedure call
METRICS_TENANTS = call("metrics_tenants_v1", 0, "*")
METRICS_QUEUES = call("metrics_queues_v1", 4, "*")
QUEUE_COUNT = "SELECT count(*) FROM queen.queues q WHERE $1::text IS NULL OR q.tenant = $1"

# Maintenance switches (130_system.sql): the value as JSON text
SYSTEM_SETTINGS = call("system_settings_v1", 0)
SYSTEM_SETTING_SET = call("system_setting_set_v1", "$1, $2::text::jsonb")

# The background jobs (queen_pg/jobs/): one bounded call each, in the order of their files (060_jobs.sql,
# 080_kv.sql, 096_outcomes.sql, 098_stats_snapshot.sql, 120_traces.sql, 130_system.sql)
LEASE_EXPIRY = call("lease_expiry_v1", 2, "*")
RETENTION = call("retention_v1", 2, "*")
DLQ_FILL = call("dlq_fill_v2", 6, "*")
KV_SWEEP = call("kv_sweep_v1", 2)
OUTCOMES_PRUNE = call("outcomes_prune_v1", 2)
STATS_SNAPSHOT = call("stats_snapshot_v1", 3)
TRACES_RETENTION = call("traces_retention_v1", 3)
STATS_SAMPLE = call("stats_sample_v1", 4, "*")
