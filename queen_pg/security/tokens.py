"""JWT verification (PyJWT): the algorithms and keys the settings allow, JWKS with a cache.

* The accepted algorithms come from ``JWT_ALGORITHM`` only, never from the token: ``auto`` reads the
  token's ``alg`` header but accepts only algorithms a configured key serves (HS256 with
  ``JWT_SECRET``, RS256 / EdDSA with ``JWT_PUBLIC_KEY`` of that type or the JWKS). ``none`` never.
* An HS256 token is checked with the secret only and an RS256/EdDSA token with a public key only, so a
  public key can never be used as an HMAC secret (key confusion).
* JWKS: fetched on first use, re-fetched every ``JWT_JWKS_REFRESH_INTERVAL`` seconds; a ``kid`` not in
  the cache triggers one refresh (concurrent misses share it; at most one miss-refresh per
  ``MISS_REFRESH_FLOOR_S``, so random kids cannot make the broker hammer the identity provider). A
  failed fetch keeps the previous keys.
* ``exp``, ``nbf`` and ``iat`` are NumericDates: a JSON number (not a string of digits, not a bool)
  that is a finite number of seconds (not NaN, not Infinity: JSON's 1e400 reads as Infinity, and an
  integer past the double range is refused too). ``exp`` is required unless ``JWT_REQUIRE_EXP=0``. One
  rule decides expiry, for a fresh token and a remembered one alike: valid while now < exp +
  ``JWT_CLOCK_SKEW`` (a fractional exp is honoured as written); a token whose ``nbf`` or ``iat`` is
  later than now + ``JWT_CLOCK_SKEW`` is not valid yet.
* Errors name what failed (expired, bad signature, wrong issuer ...), never the token or a key.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import urllib.request
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import jwt

from queen_pg.setting_values import ASYMMETRIC, load_public_key, pem_algorithm

if TYPE_CHECKING:
    from queen_pg.settings import Settings

log = logging.getLogger("queen_pg.security")

MISS_REFRESH_FLOOR_S = 1.0
NO_EXP_RECHECK_S = 300.0  # a token without exp (JWT_REQUIRE_EXP=0) is verified again after this long


class TokenError(Exception):
    """The token is missing, malformed, unverifiable or not valid now: 401."""


def numeric_date(claims: dict[str, Any], name: str) -> float | None:
    """The time claim ``name`` in seconds (None: the token has none). TokenError unless it is a JSON
    number that a double holds finitely."""
    if name not in claims:
        return None
    value = claims[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TokenError(f"token {name} is not a NumericDate (a JSON number)")
    try:
        seconds = float(value)
    except OverflowError:  # an integer past the double range
        seconds = math.inf
    if not math.isfinite(seconds):
        raise TokenError(f"token {name} is out of range (a NumericDate is a finite number of seconds)")
    return seconds


def valid_until(claims: dict[str, Any], now: float, skew: float, require: bool) -> float | None:
    """The wall-clock time the token stops being valid (exp plus the skew); None: it has no exp (and
    none is required). TokenError when exp is missing but required, when a time claim is not a
    NumericDate, or when ``nbf`` or ``iat`` is later than ``now`` plus the skew (not valid yet)."""
    for name in ("nbf", "iat"):
        at = numeric_date(claims, name)
        if at is not None and at > now + skew:
            raise TokenError("token not valid yet")
    exp = numeric_date(claims, "exp")
    if exp is None:
        if require:
            raise TokenError("token has no exp (JWT_REQUIRE_EXP)")
        return None
    return exp + skew


class Jwks:
    """The keys of a JWKS document by kid, fetched with a timeout, cached and refreshed."""

    def __init__(self, url: str, refresh_s: float, timeout_s: float) -> None:
        self.url = url
        self.refresh_s = refresh_s
        self.timeout_s = timeout_s
        self.keys: dict[str | None, jwt.PyJWK] = {}
        self.fetched_at = 0.0
        self._miss_at = 0.0
        self._lock = asyncio.Lock()
        self.fetches = 0
        self.generation = 0  # bumped when the key set changes: cached verdicts made with old keys lapse

    def _fetch(self) -> dict[str | None, jwt.PyJWK]:
        req = urllib.request.Request(self.url, headers={"Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            doc = json.loads(resp.read())
        keys: dict[str | None, jwt.PyJWK] = {}
        for raw in doc.get("keys", []):
            if raw.get("use", "sig") != "sig":
                continue
            try:
                key = jwt.PyJWK(raw)
            except jwt.PyJWTError:
                continue  # a key type or algorithm we do not verify with
            keys[raw.get("kid")] = key
        return keys

    async def refresh(self, *, miss: bool = False) -> None:
        seen = self.fetched_at
        async with self._lock:
            if self.fetched_at != seen:
                return  # another request refreshed while we waited
            now = time.monotonic()
            if miss and now - self._miss_at < MISS_REFRESH_FLOOR_S:
                return
            if miss:
                self._miss_at = now
            try:
                keys = await asyncio.to_thread(self._fetch)
                self.fetches += 1
                if {k: v.key for k, v in keys.items()} != {k: v.key for k, v in self.keys.items()}:
                    self.generation += 1
                self.keys = keys
            except Exception as exc:  # unreachable, bad JSON: keep the keys we have
                log.warning(
                    "event=jwks_fetch_failed host=%s error=%s", urlsplit(self.url).hostname, exc.__class__.__name__
                )
            self.fetched_at = time.monotonic()

    async def key(self, kid: str | None) -> jwt.PyJWK | None:
        if not self.fetched_at or time.monotonic() - self.fetched_at > self.refresh_s:
            await self.refresh()
        found = self._pick(kid)
        if found is None:
            await self.refresh(miss=True)
            found = self._pick(kid)
        return found

    def _pick(self, kid: str | None) -> jwt.PyJWK | None:
        if kid is not None:
            return self.keys.get(kid)
        return next(iter(self.keys.values())) if len(self.keys) == 1 else None


CACHE_MAX = 4096


@dataclass(frozen=True, slots=True)
class Verifier:
    """Verifies tokens; a token that verified is remembered (by its exact text) until its ``exp`` (plus
    the skew; without exp, ``NO_EXP_RECHECK_S``) or a JWKS key change, so a client's steady stream of
    calls costs one signature check. Only verified tokens enter the cache, and it is emptied when full."""

    settings: Settings
    algorithms: frozenset[str]
    public_key: Any
    jwks: Jwks | None
    cache: dict[str, tuple[dict[str, Any], float, int]] = field(default_factory=dict)

    @classmethod
    def build(cls, s: Settings) -> Verifier:
        public_key = load_public_key(s.jwt_public_key) if s.jwt_public_key else None
        jwks = (
            Jwks(s.jwt_jwks_url, s.jwt_jwks_refresh_interval, s.jwt_jwks_timeout_ms / 1000) if s.jwt_jwks_url else None
        )
        if s.jwt_algorithm != "auto":
            algs: set[str] = {s.jwt_algorithm}
        else:
            algs = set()
            if s.jwt_secret:
                algs.add("HS256")
            if public_key is not None:
                algs.add(pem_algorithm(public_key) or "")
            if jwks is not None:
                algs.update(ASYMMETRIC)
        if s.jwt_secret and len(s.jwt_secret.encode()) < 32 and "HS256" in algs:
            log.warning("event=jwt_weak_secret detail=JWT_SECRET is shorter than 32 bytes")
        return cls(s, frozenset(algs - {""}), public_key, jwks)

    async def _key(self, alg: str, kid: str | None) -> Any:
        if alg == "HS256":
            return self.settings.jwt_secret.encode()
        if self.public_key is not None and pem_algorithm(self.public_key) == alg and (kid is None or not self.jwks):
            return self.public_key
        if self.jwks is not None:
            found = await self.jwks.key(kid)
            if found is not None and found.algorithm_name in (alg, None):
                return found.key
            raise TokenError("no key for the token's key id")
        raise TokenError("no key for the token's algorithm")

    async def verify(self, token: str) -> dict[str, Any]:
        """The token's claims, or TokenError naming what is wrong (never the token itself)."""
        generation = self.jwks.generation if self.jwks is not None else 0
        hit = self.cache.get(token)
        if hit is not None:
            claims, recheck_at, gen = hit
            if time.time() < recheck_at and gen == generation:
                return claims
            del self.cache[token]
        claims = await self._verify(token)
        s = self.settings
        now = time.time()
        until = valid_until(claims, now, s.jwt_clock_skew, s.jwt_require_exp)
        if until is not None and now >= until:
            raise TokenError("token expired")
        if len(self.cache) >= CACHE_MAX:
            self.cache.clear()
        self.cache[token] = (claims, now + NO_EXP_RECHECK_S if until is None else until, generation)
        return claims

    async def _verify(self, token: str) -> dict[str, Any]:
        s = self.settings
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise TokenError("malformed token") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self.algorithms:
            raise TokenError(f"token algorithm not accepted (allowed: {', '.join(sorted(self.algorithms))})")
        kid = header.get("kid")
        key = await self._key(alg, kid if isinstance(kid, str) else None)
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[alg],
                issuer=s.jwt_issuer or None,
                audience=s.jwt_audience or None,
                leeway=s.jwt_clock_skew,
                # exp, nbf, iat: valid_until (PyJWT would take "123" or true as a number, and floor a fraction)
                options={
                    "verify_aud": bool(s.jwt_audience),
                    "verify_iss": bool(s.jwt_issuer),
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                },
            )
        except jwt.ExpiredSignatureError:
            raise TokenError("token expired") from None
        except jwt.InvalidSignatureError:
            raise TokenError("token signature invalid") from None
        except jwt.InvalidIssuerError:
            raise TokenError("token issuer not accepted") from None
        except jwt.InvalidAudienceError:
            raise TokenError("token audience not accepted") from None
        except jwt.ImmatureSignatureError:
            raise TokenError("token not valid yet") from None
        except jwt.PyJWTError as exc:
            raise TokenError(f"token invalid ({exc.__class__.__name__})") from None
        return claims
