"""Tenant resolution: which tenant a request acts in.

* Tenancy off (``QUEEN_TENANCY_HEADER=0`` and no ``JWT_TENANT_CLAIM``): the fixed default tenant;
  an ``x-queen-tenant`` header is ignored.
* ``QUEEN_TENANCY_HEADER=1``: the ``x-queen-tenant`` header, validated like a queue name; absent:
  the default tenant.
* JWT on with ``JWT_TENANT_CLAIM``: the claim names the tenant and wins; a header that disagrees is
  403, a verified token without the claim is 403. A request that carries no verified token (a
  skip path) cannot pick a tenant by header then: it gets the default tenant.
"""

from __future__ import annotations

import re
from typing import Any

from queen_pg import text
from queen_pg.settings import Settings

HEADER = "x-queen-tenant"
MAX_BYTES = 255


class TenantError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def valid_name(name: str) -> str | None:
    """Why ``name`` cannot be a tenant (the queue-name rules), or None."""
    if not name:
        return "tenant name must be a non-empty string"
    if len(name.encode()) > MAX_BYTES:
        return f"tenant name is longer than {MAX_BYTES} bytes"
    if text.has_control(name):
        return f"tenant name {text.MESSAGE}"
    return None


def resolve(settings: Settings, header: str | None, claims: dict[str, Any] | None) -> str:
    claim_name = settings.jwt_tenant_claim if settings.jwt_enabled else ""
    if claim_name:
        if claims is None:  # no verified token (skip path): the header cannot be trusted
            return settings.default_tenant
        value = claims.get(claim_name)
        if not isinstance(value, str) or valid_name(value) is not None:
            raise TenantError(403, f"token has no valid {claim_name!r} claim naming its tenant")
        if header is not None and header != value:
            raise TenantError(403, f"{HEADER} does not match the token's tenant")
        return value
    if not settings.tenancy_header or header is None:
        return settings.default_tenant
    problem = valid_name(header)
    if problem:
        raise TenantError(400, f"{HEADER}: {problem}")
    return header


def enabled(settings: Settings) -> bool:
    """Requests can act in more than one tenant."""
    return settings.tenancy_header or bool(settings.jwt_enabled and settings.jwt_tenant_claim)


_TENANT_LABEL = re.compile(rb'[{,]tenant="((?:[^"\\]|\\.)*)"')


def _escape(value: str) -> bytes:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"').encode()


def only_tenant(exposition: bytes, tenant: str) -> bytes:
    """A Prometheus text exposition without the samples labelled with another tenant (metrics
    without a tenant label, e.g. HTTP and pool metrics, stay)."""
    own = _escape(tenant)
    kept = []
    for line in exposition.split(b"\n"):
        m = _TENANT_LABEL.search(line) if not line.startswith(b"#") else None
        if m is None or m.group(1) == own:
            kept.append(line)
    return b"\n".join(kept)
