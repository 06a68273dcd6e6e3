"""Database boundary: the pool, the SQL applied at boot, driver-error mapping.

Invariants: this is the only package that imports asyncpg; every call into PostgreSQL from the
engine goes through :class:`queen_pg.db.pool.Database`, and driver errors leave it as
:class:`queen_pg.errors.QueenError` with a catalog code.
"""
