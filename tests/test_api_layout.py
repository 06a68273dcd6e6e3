"""The layout of queen_pg/api (docs/architecture.md#where-new-parts-go): one module or package per
feature, cross-cutting helpers in queen_pg/api/shared. Read from the source with ast, so a stray import
fails here before it tangles the features again:

* shared/ imports no feature;
* no module that declares routes imports another feature's module that declares routes;
* a feature imports another feature's body or answer modules only where this table says so (the
  transaction is made of the others' ops).
"""

from __future__ import annotations

import ast
from pathlib import Path

API = Path(__file__).resolve().parent.parent / "queen_pg" / "api"
PREFIX = "queen_pg.api"
# modules that wire the features together, like app.py: they may import any feature
ASSEMBLY = {"queen_pg.api", "queen_pg.api.hot"}
# feature -> the other features' modules it may import (never one that declares routes)
ALLOWED = {
    "transaction": {
        "queen_pg.api.kv.body",
        "queen_pg.api.kv.ops",
        "queen_pg.api.kv.schemas",
        "queen_pg.api.timers.body",
        "queen_pg.api.timers.ops",
        "queen_pg.api.timers.schemas",
    },
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(API.parent.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def feature_of(module: str) -> str | None:
    """``kv`` for ``queen_pg.api.kv.ops``, ``push`` for ``queen_pg.api.push``; None for shared and assembly."""
    if module in ASSEMBLY or not module.startswith(PREFIX + "."):
        return None
    top = module.split(".")[2]
    return None if top == "shared" else top


def imported(tree: ast.Module) -> set[str]:
    """Every queen_pg.api module a file imports (``from queen_pg.api import kv`` names queen_pg.api.kv)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith(PREFIX))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX):
            base = API.parent.parent.joinpath(*node.module.split("."))
            for alias in node.names:  # a submodule by name, else a name defined in node.module
                sub = (base / alias.name).is_dir() or (base / f"{alias.name}.py").exists()
                out.add(f"{node.module}.{alias.name}" if sub else node.module)
    return out


def declares_routes(tree: ast.Module) -> bool:
    return any(
        isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "router" for t in n.targets)
        for n in tree.body
    )


def sources() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(API.rglob("*.py"))}


def violations(trees: dict[str, ast.Module]) -> list[str]:
    routed = {m for m, t in trees.items() if declares_routes(t)}
    bad: list[str] = []
    for module, tree in trees.items():
        if module in ASSEMBLY:
            continue
        mine = feature_of(module)
        for target in sorted(imported(tree)):
            theirs = feature_of(target)
            if theirs is None or theirs == mine:
                continue
            if mine is None:
                bad.append(f"{module} (shared) imports the feature module {target}")
            elif target in routed and module in routed:
                bad.append(f"route module {module} imports route module {target}")
            elif target not in ALLOWED.get(mine, set()):
                bad.append(f"{module} ({mine}) imports {target} ({theirs})")
            elif target in routed:
                bad.append(f"{module} imports {target}, which declares routes")
    return bad


def test_every_feature_and_the_shared_module_are_found() -> None:
    trees = sources()
    features = {feature_of(m) for m in trees} - {None}
    assert {
        "push",
        "pop",
        "ack",
        "transaction",
        "kv",
        "timers",
        "admin",
        "status",
        "dlq",
        "traces",
        "messages",
    } <= features
    assert "queen_pg.api.shared.common" in trees
    assert {m for m, t in trees.items() if declares_routes(t)} >= {"queen_pg.api.push", "queen_pg.api.kv.routes"}


def test_no_feature_imports_another() -> None:
    assert violations(sources()) == []


def test_the_check_catches_a_route_module_importing_another() -> None:
    trees = sources()
    trees["queen_pg.api.traces"] = ast.parse("from queen_pg.api.messages import router\nrouter = None\n")
    trees["queen_pg.api.shared.gates"] = ast.parse("from queen_pg.api.status import system\n")
    trees["queen_pg.api.timers.routes"] = ast.parse("from queen_pg.api.kv.ops import WRITE_OPS\nrouter = None\n")
    assert violations(trees) == [
        "queen_pg.api.shared.gates (shared) imports the feature module queen_pg.api.status.system",
        "queen_pg.api.timers.routes (timers) imports queen_pg.api.kv.ops (kv)",
        "route module queen_pg.api.traces imports route module queen_pg.api.messages",
    ]
