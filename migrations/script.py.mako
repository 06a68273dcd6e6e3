"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}

Policy (migrations/versions/0001_baseline.py): boot applies sql/ too, so this revision must be
idempotent (ADD COLUMN IF NOT EXISTS, CREATE INDEX IF NOT EXISTS, guarded DO blocks, ...) and the
same change must be made in sql/schema.sql; tests/test_migrations.py checks both give one catalog.
"""

from __future__ import annotations

from collections.abc import Sequence

from queen_pg.migrate import execute_sql
% if imports:
${imports}
% endif

# revision identifiers, used by Alembic.
revision: str = ${repr(up_revision)}
down_revision: str | Sequence[str] | None = ${repr(down_revision)}
branch_labels: str | Sequence[str] | None = ${repr(branch_labels)}
depends_on: str | Sequence[str] | None = ${repr(depends_on)}


def upgrade() -> None:
    # execute_sql sends the text as it is (no bind parameters: `%` and `:` are literal).
    ${upgrades if upgrades else 'execute_sql("""\n    """)'}


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}
