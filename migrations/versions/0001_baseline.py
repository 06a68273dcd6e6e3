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

* upgrades by ``queen_pg.migrate.apply_sql()``, the same "sql/ as it is" (once per migration run;
  ``upgrade, downgrade = revision_steps(down=...)`` in the file):
  its table change is written once, in ``sql/schema.sql``, as a guarded idempotent statement
  (``ADD COLUMN IF NOT EXISTS``, ``CREATE INDEX IF NOT EXISTS``, ``DROP ... IF EXISTS``, a ``DO``
  block that checks the catalog before an ``ALTER``, a backfill that checks it has not run), which
  boot runs on a database of any age; a new database set up by boot and an old one brought forward
  by the revisions end with the same catalog (tests/test_migrations.py compares them);
* says in its docstring what changed and why, and holds the downgrade (what the previous release's
  procedures need back), which only it knows.

The procedures are always this checkout's, so a database stepped to an intermediate revision gets the
tables of this checkout as well: a revision marks a point of the chain, the downgrades walk it back.

Create one with ``alembic revision --rev-id NNNN -m "what changes"`` and write its downgrade SQL as
``revision_steps(down=...)`` (sent as it is, no bind parameters: ``%`` and ``:`` are literal).

downgrade() drops schema ``queen`` with everything in it: all queues and messages are lost.
"""

from __future__ import annotations

from queen_pg.migrate import revision_steps

# revision identifiers, used by Alembic (no branch labels, no cross-revision dependencies).
revision: str = "0001"
down_revision: str | None = None


upgrade, downgrade = revision_steps(down="DROP SCHEMA IF EXISTS queen CASCADE")
