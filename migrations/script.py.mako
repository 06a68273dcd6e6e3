"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}

Policy (migrations/versions/0001_baseline.py): the change is written once, in sql/schema.sql, as a
guarded idempotent statement (boot runs it on databases of every age); upgrade() applies sql/ as it
is; downgrade() gives the previous release its tables back. tests/test_migrations.py checks that
both ways give one catalog.
"""

from __future__ import annotations

from queen_pg.migrate import revision_steps
% if imports:
${imports}
% endif

# revision identifiers, used by Alembic (no branch labels, no cross-revision dependencies).
revision: str = ${repr(up_revision)}
down_revision: str | None = ${repr(down_revision)}


upgrade, downgrade = revision_steps(
    down="""
    -- what gives the previous release its tables back
    """
)
