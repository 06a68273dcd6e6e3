"""JWT with the official client (queen-mq 2.6.0): tokens, roles, producerSub, JWKS and rotation,
and the settings that refuse to start. Real broker, real HTTP, real tokens (PyJWT)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from pydantic import ValidationError
from queen import Queen

from queen_pg.security.tokens import Jwks as JwksCache
from queen_pg.settings import Settings
from tests.conftest import Broker
from tests.helpers import until
from tests.test_timers import op as timer_op

SECRET = "s3cret-for-tests-0123456789-abcdefghij"  # >= 32 bytes
ISS, AUD = "https://idp.test", "queen"
JWT_ON = {"jwt_enabled": True, "jwt_secret": SECRET, "jwt_issuer": ISS, "jwt_audience": AUD}


def token(
    role: str | None = "read-write", sub: str = "svc-a", key: Any = SECRET, alg: str = "HS256", **claims: Any
) -> str:
    now = int(time.time())
    body: dict[str, Any] = {"sub": sub, "iss": ISS, "aud": AUD, "iat": now, "exp": now + 300, **claims}
    if role is not None:
        body["role"] = role
    headers = {"kid": claims.pop("_kid")} if "_kid" in claims else None
    return jwt.encode({k: v for k, v in body.items() if k != "_kid"}, key, algorithm=alg, headers=headers)


def none_token() -> str:
    return jwt.encode({"sub": "x", "role": "admin", "iss": ISS, "aud": AUD}, None, algorithm="none")


def hs256_with_raw_key(claims: dict[str, Any], key: bytes, kid: str) -> str:
    """HS256 by hand: PyJWT refuses a PEM as an HMAC secret, an attacker's code does not."""

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    body = b64(json.dumps(claims).encode())
    sig = hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(sig)}"


def client(url: str, tok: str | None = None) -> Queen:
    return Queen(url, bearer_token=tok, retry_attempts=1) if tok else Queen(url, retry_attempts=1)


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of a client error (QueenHttpError.status or httpx's response)."""
    response = getattr(exc, "response", None)
    return getattr(exc, "status", None) or (response.status_code if response is not None else None)


def bearer(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


@pytest.fixture
async def jwt_broker(start_broker: Any) -> Broker:
    b: Broker = await start_broker(**JWT_ON)
    return b


async def test_client_with_token_pushes_and_consumes_and_messages_carry_the_sub(jwt_broker: Broker) -> None:
    rw = token("read-write", sub="svc-orders")
    async with client(jwt_broker.url, rw) as q:
        await q.queue("jq").create()
        res = await q.queue("jq").push([{"data": {"n": 1}, "transactionId": "t1", "producerSub": "forged"}])
        assert res[0]["status"] == "queued"
        msgs = await q.queue("jq").batch(5).wait(False).pop()
    assert [m["data"] for m in msgs] == [{"n": 1}]
    assert msgs[0]["producerSub"] == "svc-orders"  # the token's sub; the body's "forged" is ignored
    async with httpx.AsyncClient(base_url=jwt_broker.url, headers=bearer(token("read-only"))) as http:
        pid = msgs[0]["partitionId"]
        detail = await http.get(f"/api/v1/messages/{pid}/t1")
        assert detail.status_code == 200, detail.text
        assert detail.json()["producerSub"] == "svc-orders"


async def test_transaction_push_carries_the_sub(jwt_broker: Broker) -> None:
    async with httpx.AsyncClient(base_url=jwt_broker.url, headers=bearer(token("read-write", sub="tx-svc"))) as http:
        body = {"operations": [{"type": "push", "items": [{"queue": "tq", "payload": 1, "producerSub": "forged"}]}]}
        r = await http.post("/api/v1/transaction", json=body)
        assert r.status_code == 200, r.text
        r = await http.get("/api/v1/pop/queue/tq", params={"batch": 5})
        assert r.status_code == 200, r.text
        assert r.json()["messages"][0]["producerSub"] == "tx-svc"


async def test_without_jwt_producer_sub_is_null_and_the_body_is_ignored(broker: Broker) -> None:
    async with client(broker.url) as q:
        await q.queue("nq").push([{"data": 1, "producerSub": "forged"}])
        msgs = await q.queue("nq").batch(5).wait(False).pop()
    assert msgs[0]["producerSub"] is None


async def test_no_token_is_401_with_bearer_challenge(jwt_broker: Broker) -> None:
    async with client(jwt_broker.url) as q:
        with pytest.raises(Exception) as err:
            await q.queue("jq").push([{"data": 1}])
    assert status_of(err.value) == 401
    async with httpx.AsyncClient(base_url=jwt_broker.url) as http:
        r = await http.get("/api/v1/resources/queues")
        assert r.status_code == 401
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert r.json()["code"] == "unauthorized"
        r = await http.get("/api/v1/resources/queues", headers={"Authorization": "Basic dXNlcjpwYXNz"})
        assert r.status_code == 401
        # skip paths answer without a token
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/metrics")).status_code == 200
        # an unknown path needs a token too (no route discovery without one)
        assert (await http.get("/api/v1/nope")).status_code == 401
        assert (await http.get("/api/v1/nope", headers=bearer(token("read-only")))).status_code == 404


async def test_levels_hold_for_ids_with_slashes_and_unknown_writes_fail_closed(jwt_broker: Broker) -> None:
    """Regression: routes whose last parameter takes slashes (timer targets are always queue/key,
    transactionIds may hold `/`) were matched by no table entry, and an unmatched path fell back to
    read-only: a read-only token could cancel timers and delete, requeue or dead-letter messages."""
    rw, ro = token("read-write"), token("read-only")
    async with httpx.AsyncClient(base_url=jwt_broker.url, headers=bearer(rw)) as http:
        r = await http.post("/api/v1/timers", json={"operations": [timer_op("tq", "k1", delay_ms=3_600_000)]})
        assert r.status_code == 200, r.text
    async with httpx.AsyncClient(base_url=jwt_broker.url, headers=bearer(ro)) as http:
        for method, path in [
            ("DELETE", "/api/v1/timers/tq/k1"),
            ("DELETE", "/api/v1/messages/1/a/b"),
            ("POST", "/api/v1/messages/1/a/b/retry"),
            ("POST", "/api/v1/messages/1/a/b/dlq"),
            ("POST", "/api/v1/no/such/route"),
        ]:
            r = await http.request(method, path, json={})
            assert r.status_code == 403, (method, path, r.status_code, r.text)
        peek = await http.get("/api/v1/timers/tq/k1")  # a read stays a read
        assert peek.status_code == 200 and peek.json()["found"] is True, peek.text  # and it was not cancelled


async def test_read_only_token_cannot_push_but_can_read(jwt_broker: Broker) -> None:
    ro = token("read-only")
    async with client(jwt_broker.url, ro) as q:
        with pytest.raises(Exception) as err:
            await q.queue("jq").push([{"data": 1}])
        assert status_of(err.value) == 403
    async with httpx.AsyncClient(base_url=jwt_broker.url, headers=bearer(ro)) as http:
        r = await http.post("/api/v1/push", json={"items": [{"queue": "jq", "payload": 1}]})
        assert r.status_code == 403 and r.json()["code"] == "forbidden"
        assert (await http.get("/api/v1/resources/queues")).status_code == 200
        # KV: a get is a read, a put needs read-write
        get = {"operations": [{"op": "get", "ns": "n", "key": "k"}]}
        put = {"operations": [{"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True}]}
        assert (await http.post("/api/v1/kv", json=get)).status_code == 200
        r = await http.post("/api/v1/kv", json=put)
        assert r.status_code == 403, r.text
    async with httpx.AsyncClient(base_url=jwt_broker.url, headers=bearer(token("read-write"))) as http:
        assert (await http.post("/api/v1/kv", json=put)).status_code == 200


async def test_admin_routes_need_admin(jwt_broker: Broker) -> None:
    async with httpx.AsyncClient(base_url=jwt_broker.url, headers=bearer(token("read-write"))) as http:
        assert (await http.post("/api/v1/push", json={"items": [{"queue": "aq", "payload": 1}]})).status_code == 201
        r = await http.delete("/api/v1/resources/queues/aq")
        assert r.status_code == 403
        r = await http.post("/api/v1/system/maintenance", json={"enabled": True})
        assert r.status_code == 403
        assert (await http.get("/api/v1/resources/queues/aq")).status_code == 200  # still there
    # the array claim, and a role list mixing unknown names
    admin = token(None, roles=["auditor", "admin"])
    async with httpx.AsyncClient(base_url=jwt_broker.url, headers=bearer(admin)) as http:
        assert (await http.delete("/api/v1/resources/queues/aq")).status_code == 200
    # a valid token with no known role: authenticated, allowed nothing
    async with httpx.AsyncClient(base_url=jwt_broker.url, headers=bearer(token("guest"))) as http:
        r = await http.get("/api/v1/resources/queues")
        assert r.status_code == 403


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda: token(exp=int(time.time()) - 120), id="expired"),  # beyond the 30 s skew
        pytest.param(lambda: token(key="another-secret-0123456789-abcdefghijkl"), id="wrong-signature"),
        pytest.param(none_token, id="alg-none"),
        pytest.param(lambda: token(iss="https://evil.test"), id="wrong-issuer"),
        pytest.param(lambda: token(aud="other"), id="wrong-audience"),
        pytest.param(lambda: token(nbf=int(time.time()) + 600), id="not-yet-valid"),
        pytest.param(lambda: "not.a.jwt", id="garbage"),
    ],
)
async def test_bad_tokens_are_401(jwt_broker: Broker, bad: Any) -> None:
    tok = bad()
    async with client(jwt_broker.url, tok) as q:
        with pytest.raises(Exception) as err:
            await q.queue("jq").push([{"data": 1}])
        assert status_of(err.value) == 401
    async with httpx.AsyncClient(base_url=jwt_broker.url, headers=bearer(tok)) as http:
        r = await http.get("/api/v1/resources/queues")
        assert r.status_code == 401
        assert tok not in r.text
        assert r.json()["code"] == "unauthorized"


async def test_clock_skew_accepts_a_just_expired_token(jwt_broker: Broker) -> None:
    async with httpx.AsyncClient(base_url=jwt_broker.url) as http:
        r = await http.get("/api/v1/resources/queues", headers=bearer(token("read-only", exp=int(time.time()) - 5)))
        assert r.status_code == 200


# ---- RS256 through a JWKS document served by a local HTTP server; rotation ----


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def jwk(key: rsa.RSAPrivateKey, kid: str) -> dict[str, Any]:
    d: dict[str, Any] = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    return {**d, "kid": kid, "alg": "RS256", "use": "sig"}


class Jwks:
    def __init__(self) -> None:
        self.doc: dict[str, Any] = {"keys": []}
        self.hits = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.hits += 1
                raw = json.dumps(outer.doc).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/.well-known/jwks.json"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def jwks() -> Iterator[Jwks]:
    j = Jwks()
    yield j
    j.close()


async def test_rs256_via_jwks_and_key_rotation(start_broker: Any, jwks: Jwks) -> None:
    k1, k2 = rsa_key(), rsa_key()
    jwks.doc = {"keys": [jwk(k1, "k1")]}
    b: Broker = await start_broker(
        jwt_enabled=True, jwt_algorithm="RS256", jwt_jwks_url=jwks.url, jwt_issuer=ISS, jwt_audience=AUD
    )
    t1 = token("read-write", key=k1, alg="RS256", _kid="k1")
    async with client(b.url, t1) as q:
        assert (await q.queue("rq").push([{"data": 1}]))[0]["status"] == "queued"
        assert len(await q.queue("rq").batch(5).wait(False).pop()) == 1
    fetched = jwks.hits
    assert fetched == 1  # cached: one fetch for two calls
    # rotation: the IdP now signs with k2 and publishes only k2; a token with the new kid makes the
    # broker refresh once and accept it; the retired key's tokens are then refused
    jwks.doc = {"keys": [jwk(k2, "k2")]}
    t2 = token("read-write", key=k2, alg="RS256", _kid="k2")
    async with httpx.AsyncClient(base_url=b.url) as http:
        r = await http.get("/api/v1/resources/queues", headers=bearer(t2))
        assert r.status_code == 200, r.text
        assert jwks.hits == fetched + 1
        r = await http.get("/api/v1/resources/queues", headers=bearer(t1))
        assert r.status_code == 401
        # an HS256 token whose HMAC key is the RSA public key PEM (key confusion) is refused
        pem = k2.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        forged = hs256_with_raw_key({"sub": "x", "role": "admin", "iss": ISS, "aud": AUD}, pem, "k2")
        assert (await http.get("/api/v1/resources/queues", headers=bearer(forged))).status_code == 401
        # a token of a kid the JWKS does not know: 401 (and at most one refresh per second)
        bogus = token("read-write", key=rsa_key(), alg="RS256", _kid="nope")
        assert (await http.get("/api/v1/resources/queues", headers=bearer(bogus))).status_code == 401


async def test_the_jwks_is_fetched_again_after_its_refresh_interval_and_a_failed_fetch_keeps_the_keys(
    jwks: Jwks,
) -> None:
    """JWT_JWKS_REFRESH_INTERVAL: a key set older than the interval is fetched again (a key the IdP
    retired stops verifying without a kid miss); an unreachable JWKS keeps the keys it had."""
    k1, k2 = rsa_key(), rsa_key()
    jwks.doc = {"keys": [jwk(k1, "k1"), jwk(k2, "k2")]}
    keys = JwksCache(jwks.url, refresh_s=3600, timeout_s=2)
    assert await keys.key("k1") is not None and await keys.key("k2") is not None
    assert jwks.hits == 1  # cached within the interval
    jwks.doc = {"keys": [jwk(k2, "k2")]}  # k1 retired at the IdP
    assert await keys.key("k1") is not None  # still cached: the interval has not passed (a miss would refresh)
    keys.fetched_at -= 3601  # the interval passes (time moved, not slept)
    assert await keys.key("k2") is not None
    assert jwks.hits == 2 and "k1" not in keys.keys
    jwks.close()  # the IdP is unreachable now
    keys.fetched_at -= 3601
    assert await keys.key("k2") is not None  # the failed fetch kept the keys


async def test_eddsa_public_key_pem_and_auto(start_broker: Any) -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    b: Broker = await start_broker(
        jwt_enabled=True, jwt_algorithm="auto", jwt_public_key=pem.decode(), jwt_secret=SECRET
    )
    async with httpx.AsyncClient(base_url=b.url) as http:
        ed = token("read-only", key=key, alg="EdDSA")
        assert (await http.get("/api/v1/resources/queues", headers=bearer(ed))).status_code == 200
        hs = token("read-only")
        assert (await http.get("/api/v1/resources/queues", headers=bearer(hs))).status_code == 200
        # RS256 is not served by any configured key: refused before any signature work
        rs = token("read-only", key=rsa_key(), alg="RS256")
        r = await http.get("/api/v1/resources/queues", headers=bearer(rs))
        assert r.status_code == 401 and "algorithm" in r.json()["error"]


# ---- settings ----


def test_settings_read_the_reference_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JWT_ENABLED", "1")
    monkeypatch.setenv("JWT_SECRET", SECRET)
    monkeypatch.setenv("JWT_ROLES_CLAIM", "scope")
    monkeypatch.setenv("JWT_CLOCK_SKEW", "5")
    monkeypatch.setenv("JWT_SKIP_PATHS", "/health")
    monkeypatch.setenv("QUEEN_TENANCY_HEADER", "1")
    s = Settings()
    assert (s.jwt_enabled, s.jwt_roles_claim, s.jwt_clock_skew, s.jwt_skip_paths) == (True, "scope", 5, "/health")
    assert s.tenancy_header is True
    defaults = Settings(_env_file=None, **{"jwt_enabled": False})
    assert defaults.jwt_roles_array_claim == "roles"


def _not_the_default(field: str) -> str:
    """An environment value of ``field`` other than its default."""
    default = Settings.model_fields[field].default
    special = {"jwt_algorithm": "RS256", "jwt_jwks_url": "https://idp.test/jwks.json"}
    if field in special:
        return special[field]
    if isinstance(default, bool):
        return "0" if default else "1"
    if isinstance(default, int):
        return str(default + 1)
    return f"{default}-x"


@pytest.mark.parametrize("field", [f for f in Settings.model_fields if f.startswith("jwt_")])
def test_every_jwt_setting_is_read_from_its_reference_name(field: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """JWT_<FIELD> (the reference's name, no QUEEN_ prefix); the field name itself still sets it in code."""
    if field == "jwt_enabled":
        monkeypatch.setenv("JWT_SECRET", SECRET)
    raw = _not_the_default(field)
    by_name = getattr(Settings(**{field: raw}), field)
    assert by_name != Settings.model_fields[field].default
    assert getattr(Settings(), field) == Settings.model_fields[field].default
    monkeypatch.setenv(field.upper(), raw)
    assert getattr(Settings(), field) == by_name


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({}, "needs JWT_SECRET"),
        ({"jwt_algorithm": "RS256"}, "needs JWT_PUBLIC_KEY or JWT_JWKS_URL"),
        ({"jwt_algorithm": "RS256", "jwt_public_key": "not a pem"}, "not a PEM public key"),
        ({"jwt_algorithm": "none"}, "jwt_algorithm"),
        ({"jwt_algorithm": "auto"}, "needs JWT_SECRET, JWT_PUBLIC_KEY or JWT_JWKS_URL"),
        ({"jwt_algorithm": "RS256", "jwt_jwks_url": "file:///etc/passwd"}, "http(s)"),
    ],
)
def test_enabled_without_a_usable_key_refuses(over: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError) as err:
        Settings(database_url="postgresql://x/y", jwt_enabled=True, **over)
    assert says in str(err.value)


def test_cli_refuses_to_start_with_one_line() -> None:
    env = {"JWT_ENABLED": "1", "PATH": "/usr/bin:/bin", "QUEEN_DATABASE_URL": "postgresql://127.0.0.1:1/x"}
    out = subprocess.run(
        [sys.executable, "-m", "queen_pg.cli", "serve"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "JWT_ENABLED=1 with JWT_ALGORITHM=HS256 needs JWT_SECRET" in lines[0]


async def test_dlq_shows_the_producer_sub_while_the_payload_is_in_its_segment(start_broker: Any) -> None:
    b: Broker = await start_broker(jobs_enabled=False, **JWT_ON)  # no dlq_fill: the payload stays in the segment
    async with httpx.AsyncClient(base_url=b.url, headers=bearer(token("admin", sub="dlq-svc"))) as http:
        assert (await http.post("/api/v1/push", json={"items": [{"queue": "dq", "payload": 1}]})).status_code == 201
        m = (await http.get("/api/v1/pop/queue/dq", params={"batch": 1})).json()["messages"][0]
        ack = {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]}
        r = await http.post("/api/v1/ack/batch", json={"acknowledgments": [{**ack, "status": "dlq", "error": "x"}]})
        assert r.status_code == 200 and r.json()[0]["dlq"] is True
        dead = (await http.get("/api/v1/dlq", params={"queue": "dq"})).json()["messages"]
        assert [d["producerSub"] for d in dead] == ["dlq-svc"]


async def test_a_verified_token_is_remembered_only_until_it_expires(start_broker: Any) -> None:
    b: Broker = await start_broker(**{**JWT_ON, "jwt_clock_skew": 0})
    short = token("read-only", exp=int(time.time()) + 2)
    async with httpx.AsyncClient(base_url=b.url, headers=bearer(short)) as http:
        assert (await http.get("/api/v1/resources/queues")).status_code == 200
        assert (await http.get("/api/v1/resources/queues")).status_code == 200  # from the cache

        async def refused() -> bool:
            return (await http.get("/api/v1/resources/queues")).status_code == 401

        await until(refused, "the cached token to expire", within=6)
        r = await http.get("/api/v1/resources/queues")
        assert r.status_code == 401 and r.json()["error"] == "token expired"


async def test_a_fired_timer_carries_the_schedulers_sub(jwt_broker: Broker) -> None:
    """The producer of a timer's message is whoever scheduled it: POST /timers and a transaction's
    timers rider record the token's sub, and the fire stamps it into the frame like a push's. A
    producerSub in a timer op stays server-owned (400, nothing scheduled)."""
    rw = bearer(token("read-write", sub="alice"))
    async with httpx.AsyncClient(base_url=jwt_broker.url, headers=rw, timeout=30) as http:
        forged = await http.post("/api/v1/timers", json={"operations": [timer_op("fq", "k", producerSub="mallory")]})
        assert forged.status_code == 400 and forged.json()["reason"] == "server_owned", forged.text
        assert (await http.get("/api/v1/timers/fq")).json()["rows"] == []
        r = await http.post("/api/v1/timers", json={"operations": [timer_op("fq", "k", {"n": 1}, delay_ms=0)]})
        assert r.status_code == 200, r.text
        got = await http.get("/api/v1/pop/queue/fq", params={"batch": 5, "wait": "true", "timeout": 20_000})
        assert got.status_code == 200, got.text
        assert [(m["data"], m["producerSub"]) for m in got.json()["messages"]] == [({"n": 1}, "alice")]
    async with httpx.AsyncClient(base_url=jwt_broker.url, headers=bearer(token(sub="bob")), timeout=30) as http:
        r = await http.post("/api/v1/transaction", json={"operations": [], "timers": [timer_op("ft", "k", delay_ms=0)]})
        assert r.status_code == 200 and r.json()["success"] is True, r.text
        got = await http.get("/api/v1/pop/queue/ft", params={"batch": 5, "wait": "true", "timeout": 20_000})
        assert got.status_code == 200, got.text
        assert [m["producerSub"] for m in got.json()["messages"]] == ["bob"]


# ---- exp: a NumericDate, required by default --------------------------------------------------


def _raw_token(**claims: Any) -> str:
    """A signed token with exactly these claims besides sub/iss/aud/role (no exp unless given)."""
    return jwt.encode({"sub": "svc", "iss": ISS, "aud": AUD, "role": "read-only", **claims}, SECRET, algorithm="HS256")


async def _status(url: str, tok: str) -> tuple[int, str]:
    async with httpx.AsyncClient(base_url=url, headers=bearer(tok)) as http:
        r = await http.get("/api/v1/resources/queues")
    return r.status_code, r.json().get("error", "") if r.status_code != 200 else ""


async def test_a_numeric_string_exp_is_refused_before_and_after_it_passes(start_broker: Any) -> None:
    """PyJWT reads ``exp: "<digits>"`` as a number; the verdict cache did not (it kept such a token
    300 s, past its exp). A NumericDate is a JSON number: a string is refused at once, so it is never
    cached either (asked again once its exp passed, it is still 401)."""
    b: Broker = await start_broker(**{**JWT_ON, "jwt_clock_skew": 0})
    exp = int(time.time()) + 2
    as_string = _raw_token(exp=str(exp))
    first = await _status(b.url, as_string)  # still in the future

    async def passed() -> bool:
        return time.time() > exp + 0.1

    await until(passed, "the token's exp to pass", within=6)
    assert await _status(b.url, as_string) == (401, "token exp is not a NumericDate (a JSON number)")
    assert first == (401, "token exp is not a NumericDate (a JSON number)")
    past = _raw_token(exp=str(int(time.time()) - 600))
    assert (await _status(b.url, past))[0] == 401


@pytest.mark.parametrize(
    "exp",
    [
        pytest.param(True, id="true"),
        pytest.param(False, id="false"),
        pytest.param([int(time.time()) + 300], id="list"),
        pytest.param({"at": int(time.time()) + 300}, id="object"),
        pytest.param(None, id="null"),
    ],
)
async def test_an_exp_that_is_not_a_number_is_refused(jwt_broker: Broker, exp: Any) -> None:
    """A bool is not 1 or 0, and null or a structure is not a time."""
    assert await _status(jwt_broker.url, _raw_token(exp=exp)) == (401, "token exp is not a NumericDate (a JSON number)")


async def test_a_fractional_exp_is_honoured(start_broker: Any) -> None:
    b: Broker = await start_broker(**{**JWT_ON, "jwt_clock_skew": 0})
    assert await _status(b.url, _raw_token(exp=time.time() + 300.5)) == (200, "")
    assert (await _status(b.url, _raw_token(exp=time.time() - 0.5)))[0] == 401


async def test_a_token_without_exp_is_refused_unless_jwt_require_exp_is_off(start_broker: Any) -> None:
    forever = _raw_token()
    b: Broker = await start_broker(**JWT_ON)
    assert await _status(b.url, forever) == (401, "token has no exp (JWT_REQUIRE_EXP)")
    lax: Broker = await start_broker(**{**JWT_ON, "jwt_require_exp": False})
    assert await _status(lax.url, forever) == (200, "")
    assert (await _status(lax.url, _raw_token(exp=str(int(time.time()) + 300))))[0] == 401  # still a number


def test_jwt_require_exp_reads_its_reference_style_name(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings(_env_file=None).jwt_require_exp is True
    monkeypatch.setenv("JWT_REQUIRE_EXP", "0")
    assert Settings(_env_file=None).jwt_require_exp is False


def _signed_text(payload: str) -> str:
    """An HS256 token signed with the test secret over this exact JSON text (numbers no encoder writes)."""

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(payload.encode())
    sig = hmac.new(SECRET.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(sig)}"


OUT_OF_RANGE = ["1e400", "-1e400", "NaN", "Infinity", "-Infinity", "1" + "0" * 400, "-1" + "0" * 400]


async def test_a_time_claim_out_of_a_doubles_range_is_401(jwt_broker: Broker) -> None:
    """JSON reads 1e400 as Infinity (and Python's reader takes NaN and Infinity); an integer of 400
    digits is a number no double holds. As exp, nbf or iat, each is refused with 401 naming the claim
    (a correctly signed exp of 10^400 was a 500, an OverflowError; nbf or iat of -10^400 was accepted)."""
    later = int(time.time()) + 300
    base = f'"sub": "svc", "iss": "{ISS}", "aud": "{AUD}", "role": "read-only"'
    answers = {}
    for claim in ("exp", "nbf", "iat"):
        for raw in OUT_OF_RANGE:
            exp = "" if claim == "exp" else f', "exp": {later}'
            tok = _signed_text(f'{{{base}{exp}, "{claim}": {raw}}}')
            answers[claim, raw[:8]] = await _status(jwt_broker.url, tok)
    want = "token {} is out of range (a NumericDate is a finite number of seconds)"
    assert answers == {(claim, raw): (401, want.format(claim)) for claim, raw in answers}
    fine = _signed_text(f'{{{base}, "exp": {later}, "nbf": 1e3, "iat": -1e3}}')  # finite: any time is a time
    assert await _status(jwt_broker.url, fine) == (200, "")


@pytest.mark.parametrize("claim", ["nbf", "iat"])
async def test_nbf_and_iat_are_numeric_dates_like_exp(jwt_broker: Broker, claim: str) -> None:
    """One rule for the three time claims: a string of digits or a bool is not a time."""
    now = int(time.time())
    for value in (str(now), True):
        tok = _raw_token(exp=now + 300, **{claim: value})
        assert await _status(jwt_broker.url, tok) == (401, f"token {claim} is not a NumericDate (a JSON number)")
    assert await _status(jwt_broker.url, _raw_token(exp=now + 300, **{claim: now + 600})) == (
        401,
        "token not valid yet",
    )
    assert await _status(jwt_broker.url, _raw_token(exp=now + 300, **{claim: now - 0.5})) == (200, "")
