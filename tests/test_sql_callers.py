"""The broker's procedure calls and the procedures of sql/ match: every call names a procedure that
takes its arguments, and every procedure has a caller (no superseded version and no orphan lingers).

The broker's calls are the registry ``queen_pg/engine/calls.py``; no other module of queen_pg/ writes a
SQL string that calls ``queen.name(`` (docstrings and comments do not count). Against a database with
sql/ applied, each entry names a function of schema ``queen`` that accepts that many arguments and is
a statement PostgreSQL prepares. A public procedure (``queen.name``, no leading underscore) is called
by the broker, or listed in :data:`OPERATOR_FACING` with the reason an operator calls it by hand; a
few public names are building blocks of other procedures (:data:`CALLED_FROM_SQL`). A private helper
(``queen._name``) is reached from a live procedure, a trigger or a view of sql/. Liveness is
transitive: a helper called only by a dead procedure is dead too: that part reads the text of sql/."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

import asyncpg

from queen_pg.db.apply import sql_files
from queen_pg.engine import calls as registry
from tests.conftest import ROOT

REGISTRY = ROOT / "queen_pg" / "engine" / "calls.py"

# Public procedures no broker code calls, kept on purpose: an operator runs them in psql. Each entry
# says why; an entry whose procedure is gone, or that the broker calls after all, fails the test.
OPERATOR_FACING: dict[str, str] = {}

# Public procedures the previous release's brokers call (a rolling deploy runs both releases): kept one
# release beside their successor, then dropped in sql/procedures/000_dropped.sql. Each entry names it.
PREVIOUS_RELEASE: dict[str, str] = {
    "configure_queue_v1": "configure_queue_v2 (the caller's right to weaken a queue) replaces it",
    "timer_list_v1": "timer_list_v2 (the answer budget) replaces it",
}

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
PARAMETER = re.compile(r"\$(\d+)")

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
    """queen.* names called in a string of queen_pg/ (not a docstring) -> the modules that call them. In
    the registry these are its reads of a table (which call helpers); its calls are built from names."""
    calls: dict[str, set[str]] = {}
    for path in sorted((ROOT / "queen_pg").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        skip = docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                for name in PY_CALL.findall(node.value):
                    calls.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return calls


def broker_calls() -> dict[str, set[str]]:
    """The procedures the broker calls -> where: the registry's entries, and any SQL string of queen_pg/."""
    calls = python_calls()
    for name, _ in registry.CALLS.values():
        calls.setdefault(name, set()).add(str(REGISTRY.relative_to(ROOT)))
    return calls


def live_procedures(found: SqlCatalog, calls: dict[str, set[str]]) -> set[str]:
    kept = set(OPERATOR_FACING) | set(PREVIOUS_RELEASE)
    roots = {n for n in found.defined if not n.startswith("_") and (n in calls or n in kept)}
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
    calls = broker_calls()
    assert len(found.defined) > 50, "the parser found almost no procedure in sql/: is it broken?"
    assert "push_v3" in calls, "the registry has no call of queen.push_v3: is it read?"
    live = live_procedures(found, calls)
    dead = sorted(set(found.defined) - live)
    report = [f"queen.{name} ({', '.join(found.defined[name])})" for name in dead]
    assert not dead, (
        "procedures in sql/ that nothing calls (no call of queen_pg/engine/calls.py, no live procedure, "
        "trigger or view; not in OPERATOR_FACING): drop them (with a DROP FUNCTION IF EXISTS for databases that have "
        "them) or list them as operator-facing:\n  " + "\n  ".join(report)
    )


PROCEDURES = """
SELECT p.proname AS name, p.pronargs AS args, p.pronargdefaults AS defaults
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'queen'
"""


async def test_public_procedures_are_called_by_the_broker(conn: asyncpg.Connection) -> None:
    """Every procedure sql/ creates (as the database has it) is the registry's, an operator's
    (OPERATOR_FACING), a building block of other procedures (CALLED_FROM_SQL), or internal (``_...``):
    a public name reached only from SQL is a helper by another name."""
    created = {r["name"] for r in await conn.fetch(PROCEDURES)}
    assert set(read_sql().defined) == created, "the parser of sql/ does not see the procedures the database has"
    called = {name for name, _ in registry.CALLS.values()}
    allowed = called | set(OPERATOR_FACING) | set(CALLED_FROM_SQL) | set(PREVIOUS_RELEASE)
    orphans = sorted(n for n in created if not n.startswith("_") and n not in allowed)
    assert not orphans, "public procedures queen_pg/engine/calls.py does not call: " + ", ".join(orphans)


def test_allow_lists_are_current() -> None:
    found = read_sql()
    calls = broker_calls()
    stale = sorted(n for n in OPERATOR_FACING if n not in found.defined or n in calls or n.startswith("_"))
    assert not stale, "OPERATOR_FACING names procedures that are gone, private, or called by the broker: " + (
        ", ".join(stale)
    )
    stale = sorted(n for n in PREVIOUS_RELEASE if n not in found.defined or n in calls)
    assert not stale, "PREVIOUS_RELEASE names procedures that are gone or called by the broker: " + ", ".join(stale)
    live_sql = set().union(*(found.mentions[p] for p in live_procedures(found, calls) | {TOP_LEVEL}))
    stale = sorted(n for n in CALLED_FROM_SQL if n not in live_sql or n in calls or n in OPERATOR_FACING)
    assert not stale, "CALLED_FROM_SQL names procedures no live procedure calls (or the broker does): " + (
        ", ".join(stale)
    )


def test_calls_are_in_the_registry() -> None:
    """No module of queen_pg/ but the registry writes a SQL string that calls a procedure."""
    registry_module = str(REGISTRY.relative_to(ROOT))
    assert registry_module in python_calls().get("_iso_utc", set()), "the scan does not read the registry"
    strays = {n: sorted(m - {registry_module}) for n, m in python_calls().items() if m - {registry_module}}
    assert not strays, f"SQL strings outside queen_pg/engine/calls.py that call procedures: {strays}"


async def test_registry_calls_exist(conn: asyncpg.Connection) -> None:
    """Each entry calls a function of schema queen that takes that many arguments (its own, or with
    defaults for the rest), numbers its parameters $1 to $k in order, and is a statement PostgreSQL
    prepares; the registry's reads of a table prepare too."""
    takes: dict[str, list[range]] = {}
    for r in await conn.fetch(PROCEDURES):
        takes.setdefault(r["name"], []).append(range(r["args"] - r["defaults"], r["args"] + 1))
    assert len(registry.CALLS) > 50, "the registry holds almost no call: is it read?"
    wrong = []
    for sql, (name, count) in registry.CALLS.items():
        numbers = [int(n) for n in PARAMETER.findall(sql)]
        if not any(count in accepted for accepted in takes.get(name, [])):
            sql_takes = [f"{a.start} to {a.stop - 1}" for a in takes.get(name, [])] or ["no such procedure"]
            wrong.append(f"queen.{name} with {count} arguments: sql/ takes {', '.join(sql_takes)}")
        elif numbers != list(range(1, len(numbers) + 1)) or count < len(numbers):
            wrong.append(f"{sql}: the parameters are not $1 to $k in order")
    assert not wrong, "registry entries sql/ does not take:\n  " + "\n  ".join(wrong)
    texts = [v for k, v in vars(registry).items() if k.isupper() and not k.startswith("_") and isinstance(v, str)]
    assert set(registry.CALLS) <= set(texts)
    for sql in texts:
        await conn.prepare(sql)  # raises on a text PostgreSQL refuses
