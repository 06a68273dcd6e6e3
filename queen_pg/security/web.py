"""Browser attacks on a broker the operator can reach: foreign ``Host`` names, cross-site requests, framing.

A web page the operator opens runs in a browser that can reach the broker (loopback, the LAN). Three
holes follow, each closed here with the default settings and each a pure function of the request's
headers (a few dict lookups: these run on every request, the data plane's included):

* **DNS rebinding** (:class:`HostPolicy`): the page's own name is pointed at the broker's address, so
  its requests are same-origin to the browser and carry ``Host: <the attacker's name>``. Only names
  that cannot be rebound pass: loopback names (``localhost``, ``*.localhost``, ``127.0.0.1``,
  ``[::1]``), the bind address; on a wildcard bind (``0.0.0.0``/``::``, a container) also IP literals
  (a rebinding needs a name), single-label names (a compose service, the container's hostname: no
  public DNS answers for them) and the machine's hostname. ``QUEEN_ALLOWED_HOSTS`` replaces this with
  an exact list (``*`` = any). A request without ``Host`` (an HTTP/1.0 health check) is no browser's
  and passes the default policy.
* **Cross-site requests** (:func:`cross_site`): an ``<img>``, a link or a form on another site makes
  the browser send a GET or a body-less POST that a 415 rule cannot catch. Every request that changes
  state (any method but GET/HEAD/OPTIONS, and a GET that needs the read-write level: the pops, which
  lease or ack) is refused when the browser says it comes from another site (``Sec-Fetch-Site:
  cross-site`` or ``same-site``; without that header, an ``Origin`` that is not the request's own
  ``Host``). ``same-site`` is refused too: another port of ``localhost`` (a dev server) or a sibling
  subdomain is the same site but not the dashboard. Origins listed in ``QUEEN_CORS_ORIGINS`` pass (the
  operator opted in); a cross-site request with no ``Origin`` at all (an image, a link) never does.
  A browser sends Fetch Metadata only to a trustworthy origin (loopback, https) and ``Origin`` on a
  GET only for CORS: an ``<img>`` pointing at ``http://<lan-ip>:6632/api/v1/pop/...`` carries neither.
  So a pop GET with neither header that carries a browser's traits (:func:`browser_like`: a
  ``User-Agent`` starting ``Mozilla/``, which no web page can change on such a request, or an
  ``Accept`` of a page or an image) is refused too. Other requests with neither header (curl, the
  official clients, servers) are not browsers' and pass; a browser's POST always names its ``Origin``.
  Reads stay open: they change nothing, and without CORS the page cannot read the answer; a link from
  another site to the dashboard is such a read.
* **Framing** (:data:`FRAME_DENY`): the dashboard and the API docs refuse to be framed (clickjacking).
"""

from __future__ import annotations

import logging
import socket
from ipaddress import ip_address

from queen_pg.settings import Settings

log = logging.getLogger("queen_pg.security")

# the pages a browser shows: sent on the dashboard's files and on /docs and /redoc
FRAME_DENY = {"X-Frame-Options": "DENY", "Content-Security-Policy": "frame-ancestors 'none'"}

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", "[::]", ""})
_CACHE_MAX = 1024  # distinct Host values remembered (a flood of made-up names is decided, not stored)


def split_list(raw: str) -> list[str]:
    """A comma-separated setting's entries."""
    return [p.strip() for p in raw.split(",") if p.strip()]


def _listed(host: str, allowed: list[str]) -> bool:
    """``host`` (``name`` or ``name:port``) against QUEEN_ALLOWED_HOSTS entries (``name``,
    ``name:port``, ``*.suffix``, ``*``)."""
    host = host.lower()
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    for entry in allowed:
        if entry == "*" or entry == host or entry == name:
            return True
        if entry.startswith("*.") and (name.endswith(entry[1:])):
            return True
    return False


def _name(host: str) -> str | None:
    """The name of a ``Host`` value without its port and brackets (lower case), None if malformed."""
    host = host.lower()
    if host.startswith("["):
        name, sep, rest = host[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else rest
        if not sep or (rest and not rest.startswith(":")):
            return None
    else:
        name, _, port = host.partition(":")
    if port and not port.isdigit():
        return None
    return name


def _ip(name: str) -> bool | None:
    """True for a loopback IP literal, False for another IP literal, None for a name."""
    try:
        return ip_address(name).is_loopback
    except ValueError:
        return None


def loopback_bind(bind: str) -> bool:
    """The bind address (``QUEEN_HOST``) is reachable from this machine only."""
    name = bind.strip().lower().strip("[]")
    return name == "localhost" or _ip(name) is True


class HostPolicy:
    """Which ``Host`` headers are accepted (see the module doc); decisions are cached by value."""

    def __init__(self, settings: Settings) -> None:
        listed = [h.lower() for h in split_list(settings.allowed_hosts)]
        self.listed = listed or None
        self.any = "*" in listed
        bind = settings.host.strip().lower()
        self.wildcard = bind in WILDCARD_BINDS
        self.bind = bind.strip("[]")
        self.hostname = socket.gethostname().lower() if self.wildcard else ""
        self._seen: dict[str | None, bool] = {}

    def log_start(self) -> None:
        """One warning when the policy lets names through that a rebinding could use, or guesses."""
        if self.any:
            log.warning(
                "event=allowed_hosts_any detail=QUEEN_ALLOWED_HOSTS=* accepts any Host header: "
                "DNS rebinding is not refused"
            )
        elif self.listed is None and self.wildcard:
            log.warning(
                "event=allowed_hosts_default bind=%s hostname=%s detail=accepting Host names that are loopback, "
                "IP addresses, single-label or this hostname; other names are 400 bad_host: set "
                "QUEEN_ALLOWED_HOSTS to the names clients and proxies use (or * for any)",
                self.bind or "*",
                self.hostname,
            )

    def allows(self, host: str | None) -> bool:
        if self.any:
            return True
        hit = self._seen.get(host)
        if hit is None:
            hit = self._decide(host)
            if len(self._seen) < _CACHE_MAX:
                self._seen[host] = hit
        return hit

    def _decide(self, host: str | None) -> bool:
        if self.listed is not None:
            return host is not None and _listed(host, self.listed)
        if not host:
            return True  # no Host (HTTP/1.0): not a browser
        name = _name(host)
        if name is None:
            return False
        if name == "localhost" or name.endswith(".localhost") or name == self.bind:
            return True
        ip = _ip(name)
        if ip is not None:
            return ip or self.wildcard
        return self.wildcard and ("." not in name or name == self.hostname)


def _authority(value: str, default_port: str) -> str:
    """``host[:port]`` with the port made explicit (lower case)."""
    value = value.lower()
    if value.endswith("]") or ":" not in value.rsplit("]", 1)[-1]:
        return f"{value}:{default_port}"
    return value


def same_origin(origin: str, host: str | None) -> bool:
    """The ``Origin`` names the request's own ``Host`` (scheme's default port when either has none)."""
    scheme, sep, rest = origin.partition("://")
    if not sep or host is None or scheme.lower() not in ("http", "https"):
        return False
    port = "443" if scheme.lower() == "https" else "80"
    return _authority(rest, port) == _authority(host, port)


BROWSER_AGENT = "mozilla/"  # how every mainstream browser's User-Agent starts; a page cannot change it
BROWSER_ACCEPT = ("text/html", "image/")  # what a navigation, a frame or an image asks for


def browser_like(agent: str | None, accept: str | None) -> bool:
    """The request carries what browsers send and a web page cannot take away: a browser's
    ``User-Agent`` (a no-cors request drops a page's own; a CORS one would need a preflight), or an
    ``Accept`` of a navigation or an image. The official clients (httpx) send neither."""
    if agent is not None and agent[:8].lower() == BROWSER_AGENT:
        return True
    if accept is None:
        return False
    accept = accept.lower()
    return any(kind in accept for kind in BROWSER_ACCEPT)


def cross_site(
    method: str,
    path: str,
    site: str | None,
    origin: str | None,
    host: str | None,
    trusted: frozenset[str],
    write_gets: tuple[str, ...],
    agent: str | None = None,
    accept: str | None = None,
) -> str | None:
    """Why this request is a cross-site one that would change state (refused), or None.

    ``site``, ``origin``, ``host``, ``agent`` and ``accept`` are the request's ``Sec-Fetch-Site``,
    ``Origin``, ``Host``, ``User-Agent`` and ``Accept``; ``trusted`` the QUEEN_CORS_ORIGINS entries;
    ``write_gets`` the path prefixes of the GET routes that change state (``RouteTable.write_gets``)."""
    write_get = method in SAFE_METHODS
    if write_get and not path.startswith(write_gets):
        return None
    if site is None:
        if origin is None:
            # a browser marks nothing when the broker's origin is not trustworthy (http on a LAN
            # address): a pop GET that looks like a browser's may come from any page
            if write_get and browser_like(agent, accept):
                return (
                    "a browser request that names no Origin may not pop here: over plain http to an address "
                    "that is not loopback, any web page can make it (pop with a client that is not a "
                    "browser, or with a CORS request from an origin listed in QUEEN_CORS_ORIGINS)"
                )
            return None  # not a browser
        if same_origin(origin, host):
            return None  # a browser on this very origin
    elif site == "same-origin" or site == "none":
        return None  # the dashboard itself, or the operator typing the URL
    if origin is not None and (origin in trusted or "*" in trusted):
        return None  # the operator listed it for CORS
    return (
        "a browser request from another site may not change state here "
        "(list its origin in QUEEN_CORS_ORIGINS to allow it)"
    )
