"""The wheel is the broker: it carries sql/, migrations/ and webapp/, and the installed
package finds them. The end-to-end proof (a runtime-only venv serving a real client) is
`.ci/fresh_machine.sh`; these tests check the layout fast, on every `make test`."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from queen_pg import resources
from queen_pg.cli import build_parser
from queen_pg.db.apply import sql_dir, sql_files
from queen_pg.migrate import migrations_dir
from tests.conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SHIPPED = {"sql": "schema.sql", "migrations": "env.py", "webapp": "index.html"}


def source_files(*paths: str) -> list[str]:
    """The files of the source tree a clone would have (tracked, or new and not ignored), that exist."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "--", *paths],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    return [f for f in listed if (ROOT / f).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """A wheel built from a copy of the source tree: an in-tree build would reuse ./build, whose stale
    files (a procedure deleted since) would ship."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for f in source_files():
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("queen_pg-*.whl")
    return zipfile.ZipFile(built)


def tracked(directory: str) -> list[str]:
    """The source files under ``directory`` (the readable source), relative to it."""
    return [str(Path(f).relative_to(directory)) for f in source_files(directory)]


@pytest.mark.parametrize("directory", sorted(SHIPPED))
def test_the_wheel_carries_every_file_of(directory: str, wheel: zipfile.ZipFile) -> None:
    files = tracked(directory)
    assert files, f"git tracks nothing under {directory}/"
    names = set(wheel.namelist())
    missing = [f for f in files if f"queen_pg/{directory}/{f}" not in names]
    assert not missing, f"{directory}/ files missing from the wheel (pyproject package-data): {missing}"
    for f in files:
        assert wheel.read(f"queen_pg/{directory}/{f}") == (ROOT / directory / f).read_bytes(), f


def test_the_wheel_carries_every_python_module(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    modules = [p.relative_to(ROOT).as_posix() for p in (ROOT / "queen_pg").rglob("*.py")]
    assert modules
    missing = [m for m in modules if m not in names]
    assert not missing, f"not in the wheel (a subpackage missing from [tool.setuptools] packages?): {missing}"


def test_the_wheel_lists_httpx_as_a_runtime_dependency(wheel: zipfile.ZipFile) -> None:
    """`queen-pg serve` builds the parser of the client commands, which import httpx."""
    (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    requires = [line for line in wheel.read(meta).decode().splitlines() if line.startswith("Requires-Dist:")]
    runtime = [r for r in requires if "extra ==" not in r]
    assert any(r.split()[1].startswith("httpx") for r in runtime), runtime


def test_every_subpackage_is_listed() -> None:
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "queen_pg").rglob("__init__.py")}
    assert on_disk <= listed, on_disk - listed
    mapped = PYPROJECT["tool"]["setuptools"]["package-dir"]
    for name in SHIPPED:
        assert mapped[f"queen_pg.{name}"] == name


def test_a_checkout_reads_the_root_directories() -> None:
    assert sql_dir() == ROOT / "sql"
    assert migrations_dir() == ROOT / "migrations"
    assert sql_files()[0] == ROOT / "sql" / "schema.sql"
    assert (ROOT / "sql" / "procedures" / "020_push.sql") in sql_files()


def test_the_packaged_copy_wins_and_a_missing_one_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package, checkout = tmp_path / "site" / "queen_pg", tmp_path / "checkout"
    (package / "sql").mkdir(parents=True)
    (checkout / "sql").mkdir(parents=True)
    (package / "sql" / "schema.sql").write_text("-- packaged")
    (checkout / "sql" / "schema.sql").write_text("-- checkout")
    monkeypatch.setattr(resources, "PACKAGE", package)
    monkeypatch.setattr(resources, "CHECKOUT", checkout)
    assert resources.data_dir("sql", "schema.sql") == package / "sql"
    (package / "sql" / "schema.sql").unlink()
    assert resources.data_dir("sql", "schema.sql") == checkout / "sql"
    with pytest.raises(FileNotFoundError, match=r"webapp/index.html is neither in the package"):
        resources.data_dir("webapp", "index.html")


# --- the Dockerfile (no container engine on these machines: read and checked, not built) -----------


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile as stages of (INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            stages.append([])
        assert stages, "an instruction before the first FROM"
        stages[-1].append((word.upper(), " ".join(rest.split())))
    return stages


def dockerignored(path: str, patterns: list[str]) -> bool:
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(
        fnmatch.fnmatch(p, pat) or fnmatch.fnmatch(p, pat.removeprefix("**/")) for pat in patterns for p in prefixes
    )


def test_the_image_default_command_starts_the_broker_from_the_installed_wheel() -> None:
    *builders, final = dockerfile_stages()
    assert builders, "a build stage makes the wheel"
    assert any(i == "RUN" and "pip wheel" in a and "--no-deps" in a for i, a in builders[0])
    (cmd,) = [a for i, a in final if i == "CMD"]
    argv = json.loads(cmd)  # the exec form: the broker is PID 1 and gets docker stop's SIGTERM
    assert argv[0] in PYPROJECT["project"]["scripts"], argv
    assert PYPROJECT["project"]["scripts"][argv[0]] == "queen_pg.cli:main"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "serve"
    runs = [a for i, a in final if i == "RUN"]
    assert any(re.search(r"pip install \S*queen_pg-\*\.whl", a) for a in runs), runs
    assert not any("-e " in a or "--editable" in a for a in runs)
    # nothing of the source tree in the image: only the wheel comes from the build stage
    copies = [a for i, a in final if i in ("COPY", "ADD")]
    assert copies and all(a.startswith("--from=") for a in copies), copies
    env = " ".join(a for i, a in final if i == "ENV")
    assert "PYTHONPATH" not in env
    # an unprivileged user whose working directory (the embedded PostgreSQL's data) it owns
    (user,) = [a for i, a in final if i == "USER"]
    assert user not in ("root", "0")
    (workdir,) = [a for i, a in final if i == "WORKDIR"]
    assert any(f"chown {user}:{user} {workdir}" in a for a in runs), (user, workdir)
    data_dir = re.search(r"QUEEN_DATA_DIR=(\S+)", env)
    assert data_dir and data_dir.group(1).startswith(workdir + "/")


def test_the_dockerignore_keeps_the_checkout_out_and_the_wheel_sources_in() -> None:
    patterns = [
        p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines() if p.strip() and not p.startswith("#")
    ]
    for junk in (".venv", ".queen", ".git", "build", "dist", ".pytest_cache", ".mypy_cache", ".ruff_cache"):
        assert dockerignored(junk, patterns), f"{junk} would be sent to the docker build"
    assert dockerignored("queen_pg/api/__pycache__/app.cpython-311.pyc", patterns)
    needed = source_files("pyproject.toml", "README.md", "queen_pg", *SHIPPED)
    assert "sql/schema.sql" in needed and "pyproject.toml" in needed
    ignored = [f for f in needed if dockerignored(f, patterns)]
    assert not ignored, f".dockerignore drops files the wheel is built from: {ignored}"
