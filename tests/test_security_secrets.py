"""Nothing secret in logs, error bodies or /metrics: a broker process (debug logs) with a JWT secret
and a database password in its URL is called with good and bad tokens, and every byte it wrote or
answered is searched for the secret, the password and the tokens."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import jwt

from tests.conftest import PgServer, free_port
from tests.helpers import until

JWT_SECRET = "JWTSECRET-e1b0c44298fc1c149afbf4c8996fb924"
DB_PASSWORD = "DBPASSWORD-27ae41e4649b934ca495991b7852b855"


def with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    user = parts.username or "queen"
    host = parts.netloc.split("@")[-1]
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


def env_for(url: str, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JWT_", "QUEEN_", "DATABASE_URL"))}
    env.update(
        DATABASE_URL=url,
        PORT=str(port),
        QUEEN_LOG_LEVEL="debug",
        QUEEN_JOBS_ENABLED="1",
        JWT_ENABLED="1",
        JWT_SECRET=JWT_SECRET,
        JWT_ISSUER="iss",
    )
    return env


def tok(key: str = JWT_SECRET, **claims: object) -> str:
    now = int(time.time())
    body = {"sub": "svc", "role": "admin", "iss": "iss", "iat": now, "exp": now + 300, **claims}
    return jwt.encode(body, key, algorithm="HS256")


async def test_no_secret_in_logs_errors_or_metrics(db_url: str, pg_server: PgServer, tmp_path: Path) -> None:
    port = free_port()
    # the embedded server's real superuser password (its socket wants it); an external test server
    # is assumed to trust the socket, the password is then carried, not needed
    db_password = (pg_server.embedded.superuser_password() if pg_server.embedded else None) or DB_PASSWORD
    url = with_password(db_url, db_password)
    out_path = tmp_path / "broker.log"
    answers: list[str] = []
    good = tok()
    bad = [
        tok(key="wrong-secret-wrong-secret-wrong-secret"),
        tok(exp=int(time.time()) - 600),
        tok(iss="other"),
        tok()[:-4] + "AAAA",
        "garbage-token-value-1234567890",
    ]
    with open(out_path, "wb") as out:  # noqa: ASYNC230 - the broker process writes it
        proc = subprocess.Popen(  # noqa: ASYNC220 - a broker process, started once
            [sys.executable, "-m", "queen_pg.cli", "serve"], env=env_for(url, port), stdout=out, stderr=out
        )
        try:
            base = f"http://127.0.0.1:{port}"

            async def up() -> bool:
                assert proc.poll() is None, out_path.read_text()
                try:
                    async with httpx.AsyncClient() as h:
                        return (await h.get(f"{base}/health", timeout=1)).status_code == 200
                except httpx.TransportError:
                    return False

            await until(up, "the broker to answer /health", within=30)
            async with httpx.AsyncClient(base_url=base) as http:
                auth = {"Authorization": f"Bearer {good}"}
                r = await http.post("/api/v1/push", json={"items": [{"queue": "s", "payload": 1}]}, headers=auth)
                assert r.status_code == 201
                for t in bad:
                    r = await http.get("/api/v1/resources/queues", headers={"Authorization": f"Bearer {t}"})
                    assert r.status_code == 401
                    answers.append(r.text + str(r.headers))
                for path in ("/metrics", "/health", "/api/v1/status", "/api/v1/system/maintenance"):
                    r = await http.get(path, headers=auth)
                    answers.append(r.text + str(r.headers))
                r = await http.post("/api/v1/push", content=b"{", headers={**auth, "content-type": "application/json"})
                assert r.status_code == 400
                answers.append(r.text)
                r = await http.get("/api/v1/resources/queues", headers={"Authorization": f"Bearer {JWT_SECRET}"})
                answers.append(r.text)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    logs = out_path.read_text()
    assert "event=broker_ready" in logs  # the log captured the run at debug level
    assert logs.count("event=request_refused status=401") >= len(bad)  # ... the refusals included
    secrets = {"jwt secret": JWT_SECRET, "db password": db_password, "good token": good}
    secrets |= {f"bad token {i}": t for i, t in enumerate(bad)}
    for name, secret in secrets.items():
        assert secret not in logs, f"{name} in the broker's log output"
        for a in answers:
            assert secret not in a, f"{name} in an answer: {a[:200]}"


def test_a_failing_database_url_does_not_print_its_password(tmp_path: Path) -> None:
    url = f"postgresql://queen:{DB_PASSWORD}@127.0.0.1:{free_port()}/queen"
    out = subprocess.run(
        [sys.executable, "-m", "queen_pg.cli", "serve"],
        env=env_for(url, free_port()),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert out.stderr  # it did say why
    assert DB_PASSWORD not in out.stderr + out.stdout
    assert JWT_SECRET not in out.stderr + out.stdout
