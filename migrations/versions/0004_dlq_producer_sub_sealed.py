"""log_dlq: producer_sub and sealed

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

``producer_sub`` keeps the pushing token's ``sub`` once the dlq_fill job has copied a dead letter's
payload out of its segment (the DLQ list shows it, a requeue puts it back into the new frame).
``sealed`` holds the payload of an encrypted queue's dead letter as its frame had it (AES-256-GCM,
queen_pg/security/crypto.py); such a row's ``payload`` is JSON null, so no plaintext is copied into
``log_dlq``. Both nullable; rows written before stay as they are. The same two ``ADD COLUMN IF NOT
EXISTS`` are in ``sql/schema.sql``. Idempotent, like every revision here (see 0001_baseline.py).

downgrade() drops the two columns (the previous release's procedures do not read them); a sealed dead
letter then reads as JSON null.
"""

from __future__ import annotations

from queen_pg.migrate import revision_steps

# revision identifiers, used by Alembic (no branch labels, no cross-revision dependencies).
revision: str = "0004"
down_revision: str | None = "0003"


upgrade, downgrade = revision_steps(
    down="""
    ALTER TABLE queen.log_dlq DROP COLUMN IF EXISTS sealed;
    ALTER TABLE queen.log_dlq DROP COLUMN IF EXISTS producer_sub;
    """
)
