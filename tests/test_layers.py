"""The import layers of docs/architecture.md#imports hold: the import-linter contracts of pyproject.toml
are kept, every top-level part of queen_pg has a place in them, and the document states the same layers."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
# the leaves docs/architecture.md names outside the table: imported by the layers, importing none of them
LEAVES = {"__init__", "resources", "memtrim", "embedded_pg", "pg_binaries", "migrate", "cli_client"}


def _layers() -> list[list[str]]:
    (contract,) = [c for c in CONFIG["contracts"] if c["type"] == "layers"]
    return [[p.strip().removeprefix("queen_pg.") for p in re.split(r"[|:]", layer)] for layer in contract["layers"]]


def test_the_contracts_are_kept() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    assert lint_imports.exists(), "import-linter is a dev dependency: make install"
    run = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert f"Contracts: {len(CONFIG['contracts'])} kept, 0 broken." in run.stdout


def test_every_part_of_the_package_has_a_layer() -> None:
    named = {part for layer in _layers() for part in layer}
    parts = {p.stem for p in (ROOT / "queen_pg").glob("*.py")} | {
        p.parent.name for p in (ROOT / "queen_pg").glob("*/__init__.py")
    }
    assert parts - named - LEAVES == set(), "a new part goes into a layer of [tool.importlinter] and the doc"
    assert named & LEAVES == set()


def test_the_document_states_the_contract_layers() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", doc.split('<a id="imports"></a>')[1].split("<a id=")[0], re.M)
    stated = [[part.strip(" `") for part in cell.split(r"\|")] for _, cell in rows]
    assert stated == _layers()


def test_loading_the_engine_loads_no_web_framework() -> None:
    """A package ``__init__`` runs on any import below it, and import-linter does not count it: the
    engine (which imports ``security.crypto``) must load no FastAPI, Starlette or uvicorn."""
    code = (
        "import sys, pkgutil, importlib, queen_pg.engine as e\n"
        "for m in pkgutil.iter_modules(e.__path__): importlib.import_module('queen_pg.engine.' + m.name)\n"
        "print(sorted(n for n in ('fastapi', 'starlette', 'uvicorn') if n in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
