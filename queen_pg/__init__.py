"""queen-pg: a message broker whose only durable state lives in PostgreSQL.

Invariants: every offset, cursor, lease, segment and dedup hash is in PostgreSQL; what the broker
keeps in memory (queue config, long-poll waiters) is a cache or a scheduler, so losing it costs
work, never a message. Each API call makes at most one stored-procedure call.
"""

__version__ = "0.1.0"
