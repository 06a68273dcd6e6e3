"""Rules that several statements of sql/ must state alike are written once, or proved alike here.

The ack's commit rule (what moving a cursor does to its row: the cursor, acked_total, the retry budget,
the lease released, the attempts) is stated by three statements of sql/procedures/040_ack.sql: ack_v3's
fast path for one cursor row, its fast path for several (fused requests), and queen._ack_settle (the
look-up path, ack_v1/ack_v2, transaction_v1). An internal function holding the rule measured ~10-15 %
more PostgreSQL CPU per ack (benchmarks/sql_pop.py): each statement keeps the rule inline, with one SET
list, byte for byte (whitespace aside), fed by a row ``x`` of inputs. This reads the SQL text, so a path
that states the rule differently fails here before any behaviour test has to find the difference.
"""

from __future__ import annotations

import re

from queen_pg.db.apply import sql_dir


def _statements(text: str, head: str) -> list[str]:
    """Every statement of ``text`` starting with ``head``, up to its semicolon, whitespace collapsed."""
    out: list[str] = []
    for m in re.finditer(re.escape(head), text):
        end = text.index(";", m.start())
        out.append(" ".join(text[m.start() : end].split()))
    return out


def _set_list(statement: str) -> str:
    """The SET list of an UPDATE ... SET ... FROM statement."""
    return statement[statement.index(" SET ") : statement.index(" FROM (")]


def test_every_ack_commit_states_the_one_commit_rule() -> None:
    text = (sql_dir() / "procedures" / "040_ack.sql").read_text()
    commits = [s for s in _statements(text, "UPDATE queen.log_consumers lc") if " SET cursor_offset" in s]
    assert len(commits) == 3, commits  # the single fast path, the fused fast path, queen._ack_settle
    rules = {_set_list(s) for s in commits}
    assert len(rules) == 1, "\n\n".join(sorted(rules))
    (rule,) = rules
    for column in ("cursor_offset", "acked_total", "fail_offset", "failures", "released_lease_id", "lease_id",
                   "lease_expires_at", "lease_end", "attempts"):  # fmt: skip
        assert re.search(rf"[ ,]{column} = ", rule), column
    assert all(" FROM (SELECT " in s for s in commits)  # the rule's inputs: one row x
