"""Profile the broker with py-spy while a scenario runs, and say where its CPU goes.

py-spy samples the broker's Python processes from outside (``--nonblocking``: the broker is never
paused) and writes collapsed stacks (one line per distinct stack: ``frame;frame;… count``). Only
on-CPU samples are kept (py-spy drops idle threads by default), so the shares below are shares of the
broker's CPU time; time spent inside C code (orjson, zstd, asyncpg's protocol, httptools) is charged to
the Python line that called it, which is what the leaf's file tells. PostgreSQL's own CPU is not in it:
the load generator's per-role CPU accounting gives that.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?):(?P<line>\d+)\)$")

# leaf file -> cost category, first match wins (py-spy prints paths relative to their sys.path entry)
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("asyncio/runners.py", "event loop in C (uvloop socket I/O, httptools parsing, asyncpg protocol callbacks)"),
    ("uvloop/", "event loop in C (uvloop socket I/O, httptools parsing, asyncpg protocol callbacks)"),
    ("asyncpg/", "asyncpg (Cython protocol: encode arguments, send, decode rows; pool)"),
    ("uvicorn/", "uvicorn (HTTP protocol)"),
    ("starlette/", "FastAPI/Starlette framework (routing, middleware, responses)"),
    ("fastapi/", "FastAPI/Starlette framework (routing, middleware, responses)"),
    ("pydantic/", "pydantic validation"),
    ("prometheus_client/", "prometheus_client"),
    ("asyncio/", "asyncio (Python part: tasks, futures, timeouts)"),
    ("uuid.py", "uuid (stdlib UUID objects)"),
    ("logging/", "logging"),
)


def pyspy_path() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def category(path: str) -> str:
    for needle, name in CATEGORIES:
        if path.startswith(needle) or "/" + needle in path:
            return name
    if "queen_pg/" in path:
        return "queen_pg " + path.split("queen_pg/", 1)[1]
    m = re.search(r"site-packages/([A-Za-z0-9_]+)", path)
    return f"other: {m.group(1) if m else path}"


_CHECKOUT = str(Path(__file__).resolve().parent.parent) + "/"  # this repository, wherever it is checked out


def _short(path: str) -> str:
    for marker in ("site-packages/", _CHECKOUT, "lib/python3."):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def _counts_inclusive(path: str) -> bool:
    return "queen_pg/" in path and not path.endswith("queen_pg/cli.py")  # cli: the whole process


def summarize(collapsed: Path, top: int = 12) -> dict[str, Any]:
    """Shares of on-CPU samples: by category of the leaf frame, by leaf function, and inclusive for the
    queen_pg functions (the cost of a route or engine call, everything it calls included)."""
    by_cat: Counter[str] = Counter()
    by_leaf: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = [m for f in stack.split(";") if (m := FRAME.match(f.strip()))]
        if not frames:
            continue
        total += n
        leaf = frames[-1]
        by_cat[category(leaf["file"])] += n
        by_leaf[f"{leaf['func']} ({_short(leaf['file'])}:{leaf['line']})"] += n
        for name in {f"{f['func']} ({_short(f['file'])})" for f in frames if _counts_inclusive(f["file"])}:
            incl[name] += n

    def pct(c: Counter[str]) -> list[tuple[str, float]]:
        return [(k, round(100 * v / total, 1)) for k, v in c.most_common(top)] if total else []

    return {"samples": total, "self_by_category": pct(by_cat), "self_by_line": pct(by_leaf), "inclusive": pct(incl)}


class Profiler:
    def __init__(self, pid: int, out_dir: Path, rate: int = 100) -> None:
        exe = pyspy_path()
        if exe is None:
            raise RuntimeError("py-spy is not installed (pip install py-spy, or `make install`: it is a dev extra)")
        self.exe, self.pid, self.out_dir, self.rate = exe, pid, out_dir, rate
        self.summaries: dict[str, dict[str, Any]] = {}

    @contextmanager
    def record(self, name: str) -> Iterator[None]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        out = self.out_dir / f"{name}.txt"
        cmd = [self.exe, "record", "--pid", str(self.pid), "--subprocesses", "--nonblocking", "--format", "raw",
               "--rate", str(self.rate), "--output", str(out)]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.3)  # attach before the load starts (the load generator warms up first anyway)
        try:
            yield
        finally:
            proc.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
            try:
                _out, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                _out, err = proc.communicate()
            if out.exists():
                self.summaries[name] = summarize(out) | {"file": str(out)}
            else:
                self.summaries[name] = {"error": err.decode(errors="replace")[-1000:]}
