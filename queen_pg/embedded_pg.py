"""Run a private PostgreSQL server as a child process of the broker.

Roles and authentication: ``user`` (``queen``) is the bootstrap superuser; it is used only at start-up,
over the Unix socket, to create and hand over ``app_user`` (``queen_app``: LOGIN, no SUPERUSER,
CREATEDB or CREATEROLE), which owns the ``queen`` database and every object of the broker's schema.
``dsn()`` is the broker's: ``app_user``. Every login wants its password, scram-sha-256, never trust:
the Unix socket (in a 0700 directory only the server's account and root can enter) admits both roles,
TCP (``tcp=True``, 127.0.0.1 only) ``app_user`` alone. The passwords are generated once and kept in
``data_dir``, mode 0600, owned by the broker's account (so not readable by the ``postgres`` account
when the broker runs as root): ``pg_password`` (``app_user``) and ``pg_superuser_password``; the DSNs
name ``data_dir/pgpass`` (libpq's password file, both roles, rewritten at every start) instead of
carrying a password. ``pg_hba.conf`` is rewritten at every start.

The superuser gets its password at initdb (``--pwfile``). A data dir made before it had one (or whose
initdb was interrupted before the password file was written) is upgraded at start: ``pg_hba.conf``
trusts the superuser on the socket for that start only, the broker sets the password, saves its file,
rewrites ``pg_hba.conf`` without trust and reloads, and waits until a password-less login is refused.

PostgreSQL refuses to run as root, so as root the server runs as the unprivileged ``postgres``
account. It gets ``PR_SET_PDEATHSIG=SIGINT`` (fast shutdown), so it stops when the *thread* that
started it dies, even after ``kill -9`` of the broker: start it from the main thread, before any other
thread exists (``preexec_fn`` is not thread-safe) and before ``uvicorn.run()``.

As root the data dir belongs to the ``postgres`` account, so any name in it may be a link (or a FIFO,
or a hard link to another file) that account planted to make root act on a file elsewhere. Every file
the broker reads, writes or opens there goes through ``queen_pg.owned_files``: opened with
``O_NOFOLLOW`` and checked on its descriptor (a regular file of the expected owner with one link),
or written as a new file renamed over the name (which replaces a planted link, never its target).
A secret, the log or a directory that fails the check stops the start with an error naming it.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import pwd
import secrets
import shlex
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from queen_pg.owned_files import UnsafeFile, open_owned, read_owned, write_owned
from queen_pg.pg_binaries import Account, EmbeddedPostgresError, check_search, find_pg_bin, ids, reachable_bin

log = logging.getLogger("queen_pg.embedded_pg")

_SOCK_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1
_PR_SET_PDEATHSIG = 1
# startup failures that go away by themselves: the previous postmaster (or its backends) still exiting
_TRANSIENT = ('lock file "postmaster.pid" already exists', "is still in use")
_NOT_INHERITED = ("PG", "QUEEN_", "JWT_", "DATABASE_URL")  # environment variables the server never gets
_LOG_TAIL = 64 * 1024  # bytes of the server's log an error quotes from at most


# Everything in the broker's database that the bootstrap superuser owns goes to the app role: the
# schemas (public included: PostgreSQL 15+ lets only its owner create there) and their tables,
# sequences, views and functions. Idempotent; nothing to do on a data dir made by this version.
HAND_OVER = """
DO $$
DECLARE
    app text := {app};
    su text := {su};
    r record;
BEGIN
    FOR r IN SELECT n.nspname FROM pg_namespace n
              WHERE pg_get_userbyid(n.nspowner) = su AND n.nspname IN ('public', 'queen') LOOP
        EXECUTE format('ALTER SCHEMA %I OWNER TO %I', r.nspname, app);
    END LOOP;
    FOR r IN SELECT n.nspname, c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname IN ('public', 'queen') AND pg_get_userbyid(c.relowner) = su
                AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f') LOOP
        EXECUTE format(CASE r.relkind WHEN 'S' THEN 'ALTER SEQUENCE %I.%I OWNER TO %I'
                                      WHEN 'v' THEN 'ALTER VIEW %I.%I OWNER TO %I'
                                      WHEN 'm' THEN 'ALTER MATERIALIZED VIEW %I.%I OWNER TO %I'
                                      ELSE 'ALTER TABLE %I.%I OWNER TO %I' END,
                       r.nspname, r.relname, app);
    END LOOP;
    FOR r IN SELECT p.oid::regprocedure AS sig, p.prokind FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname IN ('public', 'queen') AND pg_get_userbyid(p.proowner) = su LOOP
        EXECUTE format(CASE r.prokind WHEN 'p' THEN 'ALTER PROCEDURE %s OWNER TO %I'
                                      ELSE 'ALTER FUNCTION %s OWNER TO %I' END, r.sig, app);
    END LOOP;
    FOR r IN SELECT t.oid::regtype AS typ FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
              WHERE n.nspname IN ('public', 'queen') AND pg_get_userbyid(t.typowner) = su
                AND t.typtype IN ('e', 'c', 'd') AND t.typrelid = 0 LOOP
        EXECUTE format('ALTER TYPE %s OWNER TO %I', r.typ, app);
    END LOOP;
END $$;
"""


def _pdeathsig_preexec(parent_pid: int) -> Callable[[], None]:
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork

    def preexec() -> None:
        # CPython's _posixsubprocess calls this after setgroups/setgid/setuid; a credential change
        # would clear PDEATHSIG, so it must be set here and not earlier.
        if prctl(_PR_SET_PDEATHSIG, int(signal.SIGINT), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def _verifier(conn: Any, user: str, password: str) -> str:
    """The SCRAM-SHA-256 verifier of ``password``, computed by libpq: the plaintext is never sent."""
    raw: bytes = conn.pgconn.encrypt_password(password.encode(), user.encode(), b"scram-sha-256")
    return raw.decode()


@dataclass
class EmbeddedPostgres:
    data_dir: Path
    port: int = 54329
    tcp: bool = False
    bin_dir: Path | None = None
    fast: bool = False
    user: str = "queen"  # bootstrap superuser: start-up only
    database: str = "queen"
    app_user: str = "queen_app"  # the broker's role: owns the database, not a superuser
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).resolve()

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "pgdata"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "postgres.log"

    @property
    def socket_dir(self) -> Path:
        """``data_dir/sock`` if the socket path fits in 107 bytes, else a private dir under /tmp named
        from a hash of data_dir (stable across restarts)."""
        local = self.data_dir / "sock"
        if len(bytes(local / f".s.PGSQL.{self.port}")) <= _SOCK_MAX and "," not in str(local):
            return local
        return Path("/tmp") / f"queen-pg-{hashlib.sha256(bytes(self.data_dir)).hexdigest()[:16]}"

    @property
    def pid(self) -> int | None:
        """Postmaster pid while it runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def password_path(self) -> Path:
        return self.data_dir / "pg_password"

    @property
    def superuser_password_path(self) -> Path:
        return self.data_dir / "pg_superuser_password"

    @property
    def passfile_path(self) -> Path:
        """libpq's password file that the DSNs name: a line for each role (``*`` host, port, database)."""
        return self.data_dir / "pgpass"

    def dsn(self, database: str | None = None) -> str:
        """The broker's DSN: ``app_user`` over the Unix socket, its password read from ``passfile_path``."""
        return self._dsn(self.app_user, database)

    def admin_dsn(self, database: str | None = None) -> str:
        """The bootstrap superuser over the Unix socket (start-up, tests, maintenance by hand)."""
        return self._dsn(self.user, database)

    def _dsn(self, user: str, database: str | None) -> str:
        db, host = quote(database or self.database, safe=""), quote(str(self.socket_dir), safe="")
        passfile = quote(str(self.passfile_path), safe="")
        return f"postgresql://{quote(user, safe='')}@/{db}?host={host}&port={self.port}&passfile={passfile}"

    def tcp_password(self) -> str:
        """``app_user``'s password for TCP connections (created on first start, mode 0600)."""
        text = read_owned(self.password_path, chmod=0o600)
        if text is None:
            raise FileNotFoundError(f"no password file {self.password_path}")
        return text.strip()

    def superuser_password(self) -> str | None:
        """The bootstrap superuser's password; None while it has none (a data dir of an older version)."""
        return (read_owned(self.superuser_password_path, chmod=0o600) or "").strip() or None

    def psql_command(self, database: str | None = None) -> str:
        """A shell command: psql as ``app_user``, its password from the password file."""
        sock, db = str(self.socket_dir), database or self.database
        psql = shlex.join(["psql", "-h", sock, "-p", str(self.port), "-U", self.app_user, db])
        return f"PGPASSFILE={shlex.quote(str(self.passfile_path))} {psql}"

    def _ensure_password(self) -> str:
        try:
            fd = open_owned(self.password_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return self.tcp_password()
        password = secrets.token_urlsafe(32)  # URL-safe: no ':' or '\\' to escape in the pgpass file
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
        return password

    def _write_pgpass(self, app_password: str, su_password: str | None) -> None:
        lines = [f"*:*:*:{self.app_user}:{app_password}"]
        if su_password is not None:
            lines.append(f"*:*:*:{self.user}:{su_password}")
        write_owned(self.passfile_path, "\n".join(lines) + "\n")

    def _write_hba(self, acct: Account, bootstrap: bool = False) -> None:
        """Socket and TCP: scram-sha-256 (TCP: app_user only). ``bootstrap``: the superuser has no
        password yet; the socket trusts it until it has one (see the module docstring)."""
        lines = [
            "# written by queen-pg at every start (queen_pg/embedded_pg.py); edits are replaced",
            *([f"local   all   {self.user}   trust"] if bootstrap else []),
            "local   all   all                          scram-sha-256",
            f"host    all   {self.app_user}   127.0.0.1/32   scram-sha-256",
            f"host    all   {self.app_user}   ::1/128        scram-sha-256",
            "host    all   all          0.0.0.0/0      reject",
            "host    all   all          ::/0           reject",
        ]
        write_owned(self.pgdata / "pg_hba.conf", "\n".join(lines) + "\n", owner=acct)

    def _account(self) -> Account:
        if os.geteuid() != 0:
            return None
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            raise EmbeddedPostgresError("running as root needs the unprivileged `postgres` account") from None
        return pw.pw_uid, pw.pw_gid

    def _prepare_dirs(self, acct: Account) -> None:
        owners = {os.geteuid(), os.geteuid() if acct is None else acct[0]}
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        sock = self.socket_dir
        with contextlib.suppress(FileExistsError):
            sock.mkdir(mode=0o700)
        for d in (self.data_dir, sock):
            try:  # refuses a squatted /tmp/queen-pg-* dir, or a link planted in place of the socket dir
                fd = open_owned(d, os.O_RDONLY | os.O_DIRECTORY, owners=owners)
            except UnsafeFile as exc:
                raise EmbeddedPostgresError(f"directory {d} exists and is not ours: {exc}") from None
            try:
                if d == sock:
                    os.fchmod(fd, 0o700)
                if acct is not None:
                    os.fchown(fd, *acct)
            finally:
                os.close(fd)
        if acct is not None:
            check_search(self.data_dir, acct)

    def _open_log(self) -> int:
        """The server's log, for appending and reading back; opened by the broker (as root: the
        ``postgres`` account can write to the data dir, so it is opened without following a link)."""
        return open_owned(self.log_path, os.O_RDWR | os.O_APPEND | os.O_CREAT)

    def _log_size(self) -> int:
        fd = self._open_log()
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def _log_since(self, offset: int) -> str:
        """What the server logged past ``offset`` (the last ``_LOG_TAIL`` bytes of it)."""
        fd = self._open_log()
        try:
            size = os.fstat(fd).st_size
            start = max(offset, size - _LOG_TAIL)
            return os.pread(fd, max(size - start, 0), start).decode(errors="replace")
        finally:
            os.close(fd)

    def _spawn(self, args: list[str], acct: Account) -> subprocess.Popen[bytes]:
        # none of the broker's settings: its secrets (keys, JWT secret, URLs) would be readable in
        # /proc/<pid>/environ by the account PostgreSQL runs as
        env = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_INHERITED)} | {"LC_ALL": "C"}
        logf = self._open_log()  # the child keeps its own copy of the descriptor
        try:
            return subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, cwd=self.data_dir,
                env=env, start_new_session=True, preexec_fn=_pdeathsig_preexec(os.getpid()), **ids(acct),
            )  # fmt: skip
        finally:
            os.close(logf)

    def start(self, timeout: float = 30.0) -> None:
        """initdb if needed, start postgres as a child process, wait until ready, create ``database``.
        EmbeddedPostgresError names what went wrong (a file in the data dir refused, see the module)."""
        if self.pid is not None:
            return
        try:
            self._start(timeout)
        except UnsafeFile as exc:
            raise EmbeddedPostgresError(f"unsafe file in the data dir: {exc}") from None

    def _start(self, timeout: float) -> None:
        t0 = time.monotonic()
        deadline = t0 + timeout
        acct = self._account()
        bin_dir = find_pg_bin(self.bin_dir)
        if acct is not None:
            bin_dir = reachable_bin(bin_dir, acct)
        self._prepare_dirs(acct)
        su_password = self.superuser_password()
        if not (self.pgdata / "PG_VERSION").is_file():
            su_password = self._initdb(bin_dir, acct, deadline)
            log.info("event=pg_initdb dir=%s seconds=%.3f", self.pgdata, time.monotonic() - t0)
        password = self._ensure_password()
        self._write_pgpass(password, su_password)
        self._write_hba(acct, bootstrap=su_password is None)
        t1 = time.monotonic()
        args = [
            str(bin_dir / "postgres"),
            "-D",
            str(self.pgdata),
            "-p",
            str(self.port),
            "-k",
            str(self.socket_dir),
            "-c",
            f"listen_addresses={'127.0.0.1' if self.tcp else ''}",
        ]
        if self.fast:
            args += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        try:
            while True:
                offset = self._log_size()
                self._proc = self._spawn(args, acct)
                if self._wait_ready(acct, deadline):
                    break
                out = self._log_since(offset)
                if time.monotonic() > deadline or not any(t in out for t in _TRANSIENT):
                    raise EmbeddedPostgresError(
                        f"postgres exited during startup (rc={self._proc.returncode}):\n{out[-3000:]}"
                    )
                time.sleep(0.1)  # the previous server is still shutting down
            self._ensure_database(deadline, password)
            if su_password is None:
                self._secure_superuser(acct, password, deadline)
        except BaseException:
            self.stop(timeout=5.0)
            raise
        log.info(
            "event=pg_started dir=%s socket=%s pid=%d seconds=%.3f",
            self.pgdata,
            self.socket_dir,
            self._proc.pid,
            time.monotonic() - t1,
        )

    def _initdb(self, bin_dir: Path, acct: Account, deadline: float) -> str:
        """initdb with a new superuser password (saved once initdb succeeded; an interrupted initdb
        leaves a data dir whose superuser is upgraded like an older version's)."""
        password = secrets.token_urlsafe(32)
        pwfile = self.data_dir / f".initdb-pw.{os.getpid()}"  # readable by the account initdb runs as
        write_owned(pwfile, password + "\n", owner=acct)
        args = [
            str(bin_dir / "initdb"),
            "-D",
            str(self.pgdata),
            "-U",
            self.user,
            f"--pwfile={pwfile}",
            "--auth-local=scram-sha-256",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--locale=C",
            "--no-instructions",
            *(["--no-sync"] if self.fast else []),
        ]
        offset = self._log_size()
        try:
            proc = self._spawn(args, acct)
            try:
                rc = proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
        finally:
            pwfile.unlink(missing_ok=True)
        if rc != 0:
            out = self._log_since(offset)
            raise EmbeddedPostgresError(f"initdb failed (rc={rc}):\n{out[-3000:]}")
        write_owned(self.superuser_password_path, password + "\n")
        return password

    def _wait_ready(self, acct: Account, deadline: float) -> bool:
        """True once postmaster.pid line 8 says ready; False if the child exited first."""
        assert self._proc is not None
        pidfile = self.pgdata / "postmaster.pid"
        server = {os.geteuid() if acct is None else acct[0]}  # the server writes it
        while self._proc.poll() is None:
            try:
                lines = (read_owned(pidfile, owners=server) or "").splitlines()
            except (OSError, UnsafeFile):
                lines = []
            # line 1 must be our pid: a stale file left by an unclean stop also says "ready"
            if len(lines) >= 8 and lines[0].strip() == str(self._proc.pid) and lines[7].strip() == "ready":
                return True
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError(f"postgres not ready in time, see {self.log_path}")
            time.sleep(0.01)
        return False

    def _ensure_database(self, deadline: float, password: str) -> None:
        """As the superuser: the app role (password set every start), the database it owns, and the
        ownership of everything in it (data dirs made before the app role existed held it all as the
        superuser)."""
        import psycopg
        from psycopg import sql

        timeout = max(int(deadline - time.monotonic()), 2)
        app = sql.Identifier(self.app_user)
        with psycopg.connect(self.admin_dsn("postgres"), autocommit=True, connect_timeout=timeout) as conn:
            if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (self.app_user,)).fetchone():
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(app))
            conn.execute(
                sql.SQL("ALTER ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS "
                        "PASSWORD {}").format(app, sql.Literal(_verifier(conn, self.app_user, password)))
            )  # fmt: skip
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)).fetchone():
                conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(self.database), app))
            else:
                conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(self.database), app))
                log.info("event=pg_created_database database=%s owner=%s", self.database, self.app_user)
        with psycopg.connect(self.admin_dsn(), autocommit=True, connect_timeout=timeout) as conn:
            conn.execute(sql.SQL(HAND_OVER).format(app=sql.Literal(self.app_user), su=sql.Literal(self.user)))

    def _secure_superuser(self, acct: Account, app_password: str, deadline: float) -> None:
        """Upgrade a data dir whose superuser has no password (started with ``bootstrap`` hba): set one,
        save it, rewrite pg_hba.conf without trust, reload, and wait until the reload took effect."""
        import psycopg
        from psycopg import sql

        assert self._proc is not None
        timeout = max(int(deadline - time.monotonic()), 2)
        password = secrets.token_urlsafe(32)
        with psycopg.connect(self.admin_dsn("postgres"), autocommit=True, connect_timeout=timeout) as conn:
            conn.execute(
                sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(self.user), sql.Literal(_verifier(conn, self.user, password))
                )
            )
        write_owned(self.superuser_password_path, password + "\n")
        self._write_pgpass(app_password, password)
        self._write_hba(acct)
        os.kill(self._proc.pid, signal.SIGHUP)  # reload pg_hba.conf (the postmaster is our child)
        with tempfile.TemporaryDirectory() as nowhere:  # libpq reads a passfile when the password is "":
            # name one in a private dir, where no other account can plant one
            bare = {"host": str(self.socket_dir), "port": self.port, "user": self.user, "dbname": "postgres",
                    "password": "", "passfile": str(Path(nowhere) / "none"), "connect_timeout": 2}  # fmt: skip
            while True:
                try:
                    psycopg.connect(**bare).close()  # type: ignore[arg-type]
                except psycopg.OperationalError:
                    break  # a login without the password is refused: the reload is in effect
                if time.monotonic() > deadline:
                    raise EmbeddedPostgresError("pg_hba.conf reload did not take effect in time")
                time.sleep(0.01)
        log.info("event=pg_superuser_password_set dir=%s", self.pgdata)

    def stop(self, timeout: float = 15.0) -> None:
        """Fast shutdown (SIGINT) and wait; immediate shutdown, then SIGKILL, past the timeout."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        t0 = time.monotonic()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGQUIT)
                try:
                    proc.wait(5.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self.socket_dir.parent != self.data_dir:  # don't leave empty /tmp/queen-pg-* behind
            with contextlib.suppress(OSError):
                self.socket_dir.rmdir()
        log.info(
            "event=pg_stopped dir=%s pid=%d rc=%s seconds=%.3f",
            self.pgdata,
            proc.pid,
            proc.returncode,
            time.monotonic() - t0,
        )

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
