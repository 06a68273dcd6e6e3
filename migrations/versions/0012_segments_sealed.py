"""log_segments.sealed: whether a segment can hold a sealed frame, so a framed pop decodes only those

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04

A framed pop on a broker that holds encryption keys (the embedded default generates one) must ship
sealed payloads opened (clients refuse frame flag 4), and had no way to know which segments hold them:
it decoded every leased segment to look (-30 % framed pop + ack). The writers of a segment know: the
push (its group's sealing, checked against the queue under the partition lock), a dead letter put back
(its payload's). Nullable without a default, so adding it rewrites nothing: the rows written before
this revision keep NULL, which readers take as "may be sealed" (decoded as before). The same column is
in ``sql/schema.sql``. Idempotent, like every revision here (see 0001_baseline.py).

downgrade() drops the column (the previous release's procedures do not read it).
"""

from __future__ import annotations

from queen_pg.migrate import revision_steps

# revision identifiers, used by Alembic (no branch labels, no cross-revision dependencies).
revision: str = "0012"
down_revision: str | None = "0011"


upgrade, downgrade = revision_steps(down="ALTER TABLE queen.log_segments DROP COLUMN IF EXISTS sealed;")
