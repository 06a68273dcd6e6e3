"""baseline: apply sql/ as it is

Revision ID: 0001
Revises:
Create Date: 2026-11-30

Policy
------
The baseline is "apply sql/ as it is": it runs ``sql/schema.sql`` and then ``sql/procedures/*.sql``
in lexical order, the files and the order that boot uses (``queen_pg.db.apply.sql_files()``), each
file sent as one text through the raw psycopg connection like boot sends it through asyncpg. It is
not a frozen snapshot: on a new database it creates the schema of the checkout that runs it, and on
a database that boot has already set up it changes nothing (every statement of sql/ is idempotent)
and only records revision 0001.

Because boot applies sql/ idempotently at every start as well, a later revision:

* carries table changes only (functions are replaced by boot from sql/procedures/; a revision
  never needs to touch them);
* is written idempotently: ``ADD COLUMN IF NOT EXISTS``, ``CREATE INDEX IF NOT EXISTS``,
  ``DROP ... IF EXISTS``, a ``DO`` block that checks the catalog before an ``ALTER ... TYPE`` or
  ``SET STORAGE``: it may run on a database whose boot already made the change, or before it;
* comes with the same change in ``sql/schema.sql``, written so that a new database set up by boot
  alone and an old one brought forward by the revisions end with the same catalog
  (tests/test_migrations.py compares them).

Create one with ``alembic revision --rev-id 0002 -m "what changes"`` and run SQL with
``queen_pg.migrate.execute_sql`` (no bind parameters, so ``%`` and ``:`` are literal).

downgrade() drops schema ``queen`` with everything in it: all queues and messages are lost.
"""

from __future__ import annotations

from collections.abc import Sequence

from queen_pg.db.apply import sql_files
from queen_pg.migrate import execute_sql

# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for path in sql_files():
        execute_sql(path.read_text())


def downgrade() -> None:
    execute_sql("DROP SCHEMA IF EXISTS queen CASCADE")
