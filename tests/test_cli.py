"""The queen-pg command: --help, settings errors, and `serve` with its embedded PostgreSQL as a real
process (the path `make run` takes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from queen_pg.cli import SERVE_OPTIONS, _env_name, main
from tests.conftest import free_port


def test_serve_help_documents_every_option_and_its_env_var(capsys) -> None:  # type: ignore[no-untyped-def]
    try:
        main(["serve", "--help"])
    except SystemExit as exc:
        assert exc.code == 0
    out = capsys.readouterr().out
    for flag, field, _t, _h in SERVE_OPTIONS:
        assert flag in out and _env_name(field) in out
    for extra in ("--pg-tcp", "QUEEN_PG_TCP", "--no-apply-schema", "QUEEN_APPLY_SCHEMA", "DATABASE_URL"):
        assert extra in out


def test_invalid_setting_is_a_clear_error(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PORT", "not-a-port")
    assert main(["serve"]) == 2
    assert "invalid settings" in capsys.readouterr().err


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _embedded_env(tmp_path: Path, port: int, **extra: str) -> dict[str, str]:
    """`queen-pg serve` on ``port`` with its embedded PostgreSQL under ``tmp_path / "data"``."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "QUEEN_DATABASE_URL")}
    env.update(
        PORT=str(port),
        QUEEN_DATA_DIR=str(tmp_path / "data"),
        QUEEN_PG_PORT=str(free_port()),
        QUEEN_HOST="127.0.0.1",
        **extra,
    )
    return env


def _wait_healthy(
    base: str, timeout: float, what: str, proc: subprocess.Popen[bytes] | None = None, log: Path | None = None
) -> None:
    """Until ``GET {base}/health`` answers 200; with ``proc``, fail (showing ``log``) as soon as it exits."""

    def healthy() -> bool:
        if proc is not None:
            assert proc.poll() is None, log.read_text() if log is not None else "the broker exited"
        try:
            return httpx.get(f"{base}/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    _wait(healthy, timeout, what)


def _postmaster(tmp_path: Path) -> Path:
    return tmp_path / "data" / "pgdata" / "postmaster.pid"


def _term_stops_postgres(proc: subprocess.Popen[bytes], tmp_path: Path, timeout: float) -> None:
    """SIGTERM: the broker exits 0 and its embedded PostgreSQL stops and removes its pid file."""
    pg_pid = int(_postmaster(tmp_path).read_text().split()[0])
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout) == 0
    assert not _alive(pg_pid) and not _postmaster(tmp_path).exists()


def test_serve_with_embedded_postgres_and_kill_9(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = _embedded_env(tmp_path, port)
    log = open(tmp_path / "out.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "queen_pg.cli", "serve"], env=env, stdout=log, stderr=log)
    try:
        _wait_healthy(base, 15, "/health", proc, tmp_path / "out.log")
        out = (tmp_path / "out.log").read_text()
        assert "psql -h" in out  # the command that opens the embedded database
        r = httpx.post(f"{base}/api/v1/push", json={"items": [{"queue": "q", "payload": 1}]})
        assert r.status_code == 201
        pg_pid = int(_postmaster(tmp_path).read_text().split()[0])
        assert _alive(pg_pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        _wait(lambda: not _alive(pg_pid), 15, "PostgreSQL to stop after kill -9 of the broker")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()

    # durable: a new broker on the same data dir still has the message
    proc = subprocess.Popen(
        [sys.executable, "-m", "queen_pg.cli", "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _wait_healthy(base, 15, "/health after restart")
        r = httpx.get(f"{base}/api/v1/pop/queue/q")
        assert r.status_code == 200 and r.json()["messages"][0]["data"] == 1
        _term_stops_postgres(proc, tmp_path, 15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
