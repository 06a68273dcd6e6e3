"""The machine a benchmark ran on: CPU, cores, RAM, kernel, Python, PostgreSQL, versions, git commit."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fastapi", "starlette", "uvicorn", "uvloop", "httptools", "asyncpg", "orjson", "zstandard", "pydantic")
PG_SETTINGS = ("shared_buffers", "synchronous_commit", "fsync", "max_connections", "wal_level")
RESULTS = ROOT / "benchmarks" / "results"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gb() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def loadavg() -> list[float]:
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return []


def _git(*args: str, cwd: Path = ROOT) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def git_state(tree: Path = ROOT) -> tuple[str | None, bool | None]:
    """A source tree's commit and whether it has uncommitted changes to tracked files (None: unknown)."""
    status = _git("status", "--porcelain", "--untracked-files=no", cwd=tree)
    return _git("rev-parse", "--short", "HEAD", cwd=tree), (bool(status) if status is not None else None)


def result_path(kind: str = "", tree: Path = ROOT) -> Path:
    """Where a run writes its results: ``benchmarks/results/<date>-<commit>[-dirty][-<kind>].json``, the
    UTC date of the run and the short commit of the tree measured (``-dirty`` when it had uncommitted
    changes), so a file says what it measured and a new run never overwrites another day's or commit's.
    ``kind`` tells the tools apart (``workers``, ``mesh``, ``status``); the suite (``make bench``) has none."""
    commit, dirty = git_state(tree)
    parts = [time.strftime("%Y-%m-%d", time.gmtime()), commit or "nocommit"]
    parts += ["dirty"] if dirty else []
    parts += [kind] if kind else []
    return RESULTS / ("-".join(parts) + ".json")


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    commit, dirty = git_state()
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "ram_gb": _ram_gb(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "git_commit": commit,
        "git_dirty": dirty,
        "packages": {p: _version(p) for p in PACKAGES},
        "loadavg_start": loadavg(),
    }


def postgres_info(dsn: str) -> dict[str, Any]:
    """Server version and the settings that matter for throughput (what the embedded server runs with)."""
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=10) as conn:
            row = conn.execute("SELECT current_setting('server_version')").fetchone()
            settings = {
                name: val
                for name, val in conn.execute(
                    "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)", (list(PG_SETTINGS),)
                ).fetchall()
            }
    except psycopg.Error as exc:
        return {"error": str(exc)}
    return {"version": row[0] if row else None, "settings": settings}
