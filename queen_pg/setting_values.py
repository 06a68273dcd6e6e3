"""Parsers of the setting values that a feature also reads at run time: the mesh peer list, an
encryption key, the JWT keys.

``queen_pg/settings.py`` checks these values at boot and the feature that uses them (``mesh/node.py``,
``security/crypto.py``, ``security/tokens.py``) parses them with the same function, so both agree on
what is valid. This module is a leaf: it imports no module of queen_pg, so the settings import no
feature (docs/architecture.md#imports; ``[tool.importlinter]`` in pyproject.toml enforces it).
"""

from __future__ import annotations

from typing import Any, Protocol
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key

ASYMMETRIC = ("RS256", "EdDSA")  # the JWT algorithms a public key (PEM or JWKS) serves


def parse_peers(text: str) -> tuple[tuple[str, int], ...]:
    """``host:port,host:port`` (IPv6 as ``[::1]:7000``); ValueError naming the bad entry."""
    out: list[tuple[str, int]] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"mesh peer {item!r} is not host:port")
        out.append((host, int(port)))
    return tuple(out)


def parse_key(text: str, name: str) -> bytes:
    """A 64-hex-character key as 32 bytes; ValueError naming the setting (never the value) otherwise."""
    raw = text.strip()
    if len(raw) != 64:
        raise ValueError(f"{name} must be 64 hex characters (32 bytes), got {len(raw)} characters")
    try:
        return bytes.fromhex(raw)
    except ValueError:
        raise ValueError(f"{name} must be 64 hex characters (32 bytes): not hex") from None


def parse_keys(key: str, old: str) -> tuple[bytes | None, list[bytes]]:
    """QUEEN_ENCRYPTION_KEY (None when empty) and QUEEN_ENCRYPTION_KEYS_OLD (comma-separated) as bytes."""
    olds = [parse_key(k, "QUEEN_ENCRYPTION_KEYS_OLD") for k in old.split(",") if k.strip()]
    return (parse_key(key, "QUEEN_ENCRYPTION_KEY") if key.strip() else None), olds


def load_public_key(pem: str) -> Any:
    """A PEM public key (``\\n`` escapes allowed, as an environment variable carries them)."""
    return load_pem_public_key(pem.replace("\\n", "\n").encode())


def pem_algorithm(key: Any) -> str | None:
    """The JWT algorithm a loaded public key serves, or None for a key type JWT here does not use."""
    if isinstance(key, RSAPublicKey):
        return "RS256"
    if isinstance(key, Ed25519PublicKey):
        return "EdDSA"
    return None


class JwtKeys(Protocol):
    """The settings :func:`key_problem` reads (``queen_pg.settings.Settings`` has them)."""

    @property
    def jwt_algorithm(self) -> str: ...
    @property
    def jwt_secret(self) -> str: ...
    @property
    def jwt_public_key(self) -> str: ...
    @property
    def jwt_jwks_url(self) -> str: ...


def key_problem(s: JwtKeys) -> str | None:
    """Why JWT_ENABLED=1 cannot work with these settings (one line), or None."""
    alg = s.jwt_algorithm
    pem_alg = None
    if s.jwt_public_key:
        try:
            pem_alg = pem_algorithm(load_public_key(s.jwt_public_key))
        except (ValueError, TypeError):
            return "JWT_PUBLIC_KEY is not a PEM public key"
        if pem_alg is None:
            return "JWT_PUBLIC_KEY must be an RSA (RS256) or Ed25519 (EdDSA) public key"
    if s.jwt_jwks_url and urlsplit(s.jwt_jwks_url).scheme not in ("http", "https"):
        return "JWT_JWKS_URL must be an http(s) URL"
    if alg == "HS256" and not s.jwt_secret:
        return "JWT_ENABLED=1 with JWT_ALGORITHM=HS256 needs JWT_SECRET"
    if alg in ASYMMETRIC and not s.jwt_jwks_url:
        if not s.jwt_public_key:
            return f"JWT_ENABLED=1 with JWT_ALGORITHM={alg} needs JWT_PUBLIC_KEY or JWT_JWKS_URL"
        if pem_alg != alg:
            return f"JWT_PUBLIC_KEY is a {pem_alg} key but JWT_ALGORITHM is {alg}"
    if alg == "auto" and not (s.jwt_secret or s.jwt_public_key or s.jwt_jwks_url):
        return "JWT_ENABLED=1 with JWT_ALGORITHM=auto needs JWT_SECRET, JWT_PUBLIC_KEY or JWT_JWKS_URL"
    return None
