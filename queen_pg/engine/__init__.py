"""The engine: thin typed callers of the stored procedures, one module per verb family.

Invariants: no FastAPI here; each public function makes at most one stored-procedure call through
``queen_pg.db.pool.Database``, whose SQL text is an entry of the registry ``calls.py``; packing,
hashing, zstd and JSON rendering happen here in Python, decisions (offsets, dedup verdicts, leases,
cursors) happen in SQL under row locks.
"""
