"""Rules that several statements of sql/ would otherwise state alike are written once: proved here.

The ack's commit rule (what moving a cursor does to its row: the cursor, acked_total, the retry budget,
the lease released, the attempts) is one UPDATE, in queen._ack_commit (sql/procedures/040_ack.sql),
which every committing path of the ack calls: ack_v3's fast path for one cursor row, its fast path for
several (fused requests), and queen._ack_settle (the look-up path, ack_v1/ack_v2, transaction_v1). This
reads the SQL text, so a second statement stating the rule (a copy pasted into a path) fails here
before any behaviour test has to find the difference between the copies.
"""

from __future__ import annotations

import re

from queen_pg.db.apply import sql_dir

# the columns the commit rule sets (seek, clear and pop move cursors under rules of their own, in files of
# their own; message_dlq_v1 commits through queen._ack_commit too)
RULE_COLUMNS = ("cursor_offset", "acked_total", "fail_offset", "failures", "released_lease_id", "lease_id",
                "lease_expires_at", "lease_end", "attempts")  # fmt: skip
ACK_SQL = sql_dir() / "procedures" / "040_ack.sql"


def _updates(text: str) -> list[str]:
    """Every ``UPDATE queen.log_consumers`` statement of ``text``, up to its semicolon, whitespace collapsed."""
    out: list[str] = []
    for m in re.finditer(r"UPDATE queen\.log_consumers\b", text):
        end = text.index(";", m.start())
        out.append(" ".join(text[m.start() : end].split()))
    return out


def _function_bodies(text: str) -> dict[str, str]:
    """``queen.<name>`` -> its body, for every ``CREATE OR REPLACE FUNCTION`` of ``text``."""
    out: dict[str, str] = {}
    for m in re.finditer(r"CREATE OR REPLACE FUNCTION (queen\.\w+)\(.*?AS (\$\w*\$)(.*?)\2", text, re.S):
        out[m.group(1)] = m.group(3)
    return out


def test_the_ack_commit_rule_is_one_statement_in_queen_ack_commit() -> None:
    """Of the ack's statements, one moves a cursor: queen._ack_commit's, which states the whole rule."""
    moves = [
        (fn, stmt)
        for fn, body in _function_bodies(ACK_SQL.read_text()).items()
        for stmt in _updates(body)
        if re.search(r" SET (.*[ ,])?cursor_offset = ", stmt)
    ]
    assert [fn for fn, _ in moves] == ["queen._ack_commit"], moves
    ((_, rule),) = moves
    for column in RULE_COLUMNS:
        assert re.search(rf"[ ,]{column} = ", rule), column
    # and nothing outside a function body (a DO block, a second definition) moves one either
    assert len([s for s in _updates(ACK_SQL.read_text()) if " cursor_offset = " in s.split(" WHERE ")[0]]) == 1


def test_every_ack_commit_calls_queen_ack_commit() -> None:
    """The paths that commit an ack (the cursor moved under the ack's rule) reach it through the function:
    queen._ack_settle once (its step 4) and queen.ack_v3's two fast paths."""
    bodies = _function_bodies(ACK_SQL.read_text())
    calls = {fn: body.count("queen._ack_commit(") for fn, body in bodies.items() if "queen._ack_commit(" in body}
    assert calls == {"queen._ack_settle": 1, "queen.ack_v3": 2}, calls
