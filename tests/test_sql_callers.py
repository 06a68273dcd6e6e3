"""Every procedure in sql/ has a caller: no superseded version and no orphan lingers.

A public procedure (``queen.name``, no leading underscore) is called from the broker: a SQL string in
queen_pg/ names ``queen.name(`` (docstrings and comments do not count), or it is listed in
:data:`OPERATOR_FACING` with the reason an operator calls it by hand. A few public names are
building blocks of other procedures (:data:`CALLED_FROM_SQL`). A private helper
(``queen._name``) is reached from a live procedure, a trigger or a view of sql/. Liveness is
transitive: a helper called only by a dead procedure is dead too.

Static (no database): it reads the text of sql/ and the AST of queen_pg/."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from queen_pg.db.apply import sql_files
from tests.conftest import ROOT

# Public procedures no broker code calls, kept on purpose: an operator runs them in psql. Each entry
# says why; an entry whose procedure is gone, or that the broker calls after all, fails the test.
OPERATOR_FACING: dict[str, str] = {}

# Public names that live procedures call (older than the leading-underscore convention, and called by
# name in tests and benchmarks): kept while a live procedure calls them, which the test checks.
CALLED_FROM_SQL: dict[str, str] = {
    "push_v1": "the one-row-per-item push: push_v2 (request key), transaction_v1 and timers_fire_v1 call it",
    "tenant_overview_v1": "the tenant's tenant_stats row or its live figures: resources_overview_v1 calls it",
}

CREATE_FUNCTION = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+queen\.(\w+)\s*\(", re.IGNORECASE)
BODY_START = re.compile(r"\bAS\s+(\$\w*\$)", re.IGNORECASE)
DROP_STATEMENT = re.compile(r"\bDROP\s+FUNCTION\b[^;]*;", re.IGNORECASE)
STRING_LITERAL = re.compile(r"'(?:[^']|'')*'")
LINE_COMMENT = re.compile(r"--[^\n]*")
BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)
QUALIFIED = re.compile(r"\bqueen\.(\w+)\b")
PY_CALL = re.compile(r"\bqueen\.(\w+)\s*\(")

TOP_LEVEL = "<top level of sql/: triggers, views, DO blocks>"


@dataclass
class SqlCatalog:
    """The procedures sql/ creates and, for each place (a procedure's bodies, or the top level), the
    queen.* names it mentions."""

    defined: dict[str, list[str]] = field(default_factory=dict)  # name -> files
    mentions: dict[str, set[str]] = field(default_factory=dict)  # place -> names


def strip_comments(text: str) -> str:
    return LINE_COMMENT.sub("", BLOCK_COMMENT.sub("", text))


def read_sql() -> SqlCatalog:
    found = SqlCatalog()
    top: list[str] = []
    for path in sql_files(ROOT / "sql"):
        text = strip_comments(path.read_text())
        pos = 0
        while (create := CREATE_FUNCTION.search(text, pos)) is not None:
            top.append(text[pos : create.start()])
            name = create.group(1)
            found.defined.setdefault(name, []).append(path.name)
            start = BODY_START.search(text, create.end())
            assert start is not None, f"{path.name}: queen.{name} has no dollar-quoted body"
            tag = start.group(1)
            end = text.find(tag, start.end())
            assert end >= 0, f"{path.name}: queen.{name}'s body {tag} is not closed"
            # the signature (defaults may call helpers) and the body belong to the procedure
            found.mentions.setdefault(name, set()).update(QUALIFIED.findall(text[create.end() : end]))
            pos = end + len(tag)
        top.append(text[pos:])
    # the drops of gone versions and the catalog probes in DO blocks ('queen.x(...)' strings) call nothing
    rest = STRING_LITERAL.sub("''", DROP_STATEMENT.sub("", "\n".join(top)))
    found.mentions[TOP_LEVEL] = set(QUALIFIED.findall(rest))
    return found


def docstrings(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def python_calls() -> dict[str, set[str]]:
    """queen.* names called in a string of queen_pg/ (not a docstring) -> the modules that call them."""
    calls: dict[str, set[str]] = {}
    for path in sorted((ROOT / "queen_pg").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        skip = docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                for name in PY_CALL.findall(node.value):
                    calls.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return calls


def live_procedures(found: SqlCatalog, calls: dict[str, set[str]]) -> set[str]:
    roots = {n for n in found.defined if not n.startswith("_") and (n in calls or n in OPERATOR_FACING)}
    live: set[str] = set()
    todo = [*roots, TOP_LEVEL]
    while todo:
        place = todo.pop()
        for name in found.mentions.get(place, set()):
            if name in found.defined and name not in live:
                live.add(name)
                todo.append(name)
        if place != TOP_LEVEL:
            live.add(place)
    return live


def test_every_procedure_has_a_caller() -> None:
    found = read_sql()
    calls = python_calls()
    assert len(found.defined) > 50, "the parser found almost no procedure in sql/: is it broken?"
    assert "push_v3" in calls, "the Python scan found no call of queen.push_v3: is it broken?"
    live = live_procedures(found, calls)
    dead = sorted(set(found.defined) - live)
    report = [f"queen.{name} ({', '.join(found.defined[name])})" for name in dead]
    assert not dead, (
        "procedures in sql/ that nothing calls (no SQL string of queen_pg/, no live procedure, trigger or "
        "view; not in OPERATOR_FACING): drop them (with a DROP FUNCTION IF EXISTS for databases that have "
        "them) or list them as operator-facing:\n  " + "\n  ".join(report)
    )


def test_public_procedures_are_called_by_the_broker() -> None:
    """A public name reached only from SQL is a helper by another name: the broker calls it, or an
    operator does (OPERATOR_FACING), or it is named ``_...``."""
    found = read_sql()
    calls = python_calls()
    public = {n for n in found.defined if not n.startswith("_")}
    orphans = sorted(n for n in public if n not in calls and n not in OPERATOR_FACING and n not in CALLED_FROM_SQL)
    assert not orphans, "public procedures no SQL string of queen_pg/ calls: " + ", ".join(orphans)


def test_allow_lists_are_current() -> None:
    found = read_sql()
    calls = python_calls()
    stale = sorted(n for n in OPERATOR_FACING if n not in found.defined or n in calls or n.startswith("_"))
    assert not stale, "OPERATOR_FACING names procedures that are gone, private, or called by the broker: " + (
        ", ".join(stale)
    )
    live_sql = set().union(*(found.mentions[p] for p in live_procedures(found, calls) | {TOP_LEVEL}))
    stale = sorted(n for n in CALLED_FROM_SQL if n not in live_sql or n in calls or n in OPERATOR_FACING)
    assert not stale, "CALLED_FROM_SQL names procedures no live procedure calls (or the broker does): " + (
        ", ".join(stale)
    )


def test_python_calls_only_procedures_sql_defines() -> None:
    """The other way round: every queen.name( in a SQL string of queen_pg/ is a procedure of sql/ (or a
    relation, which the scan cannot call with a parenthesis)."""
    found = read_sql()
    unknown = {n: sorted(m) for n, m in python_calls().items() if n not in found.defined}
    assert not unknown, f"queen_pg/ calls procedures sql/ does not define: {unknown}"
