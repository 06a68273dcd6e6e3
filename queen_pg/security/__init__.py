"""Security: JWT verification and keys, the route-to-level table, tenant resolution, web hygiene.

Invariants:
* Everything here runs as pure-ASGI middleware before any route; a route never reads a token. Routes
  get the caller from ``scope["state"]["queen_principal"]`` (``principal()``, ``need()``,
  ``queen_pg.api.common.tenant()``).
* Every route of the app has a level, declared beside the route (``access.level``); the app hands the
  table over when it is built (``access.declare_routes``), and a route without one fails the build.
* With everything off (the defaults) the middleware refuses only what a browser could be made to do:
  a foreign ``Host`` (400), a cross-site request that changes state (403), a non-JSON state-changing
  body (415); every other request gets the fixed default tenant and every level.
* Secrets (JWT_SECRET, keys, tokens, database passwords) never reach a log line, an error body or
  /metrics.
"""
