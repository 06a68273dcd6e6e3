"""The dashboard: ``/`` serves ``webapp/index.html`` and ``/dashboard/<file>`` the files beside it.

The files are plain ES modules with their libraries vendored under ``webapp/vendor/`` (no build step,
no CDN, no Node.js at run time). They are found the way ``queen_pg/db/apply.py`` finds ``sql/``: beside
the package in a checkout, or inside it when installed. There is no run-time override of the folder:
what a replica serves is what its package ships. The pages call only the public HTTP API.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, Response

from queen_pg.errors import NOT_FOUND, QueenError
from queen_pg.resources import data_dir
from queen_pg.security.access import level
from queen_pg.security.roles import Level
from queen_pg.security.web import FRAME_DENY

router = APIRouter(include_in_schema=False)

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}
# a replica upgraded in place must not serve a stale module next to a new one: revalidate every time
# (FileResponse answers 304 to a matching If-None-Match / If-Modified-Since); and no page may frame
# the dashboard (clickjacking its buttons)
_HEADERS = {"Cache-Control": "no-cache", **FRAME_DENY}


def webapp_dir() -> Path:
    """The ``webapp/`` directory: packaged inside the wheel, or the checkout's (queen_pg/resources.py)."""
    return data_dir("webapp", "index.html")


def _file(root: Path, name: str) -> Response:
    try:
        path = (root / name).resolve()
        found = path.is_relative_to(root) and path.is_file() and path.suffix in _TYPES
    except (ValueError, OSError):  # a NUL in the name (ValueError), a name past NAME_MAX (ENAMETOOLONG)
        found = False
    if not found:
        raise QueenError(NOT_FOUND, detail=f"no dashboard file {name!r}")
    return FileResponse(path, media_type=_TYPES[path.suffix], headers=_HEADERS)


@router.api_route("/", methods=["GET", "HEAD"])
@level(Level.READ_ONLY)
async def index() -> Response:
    return _file(webapp_dir().resolve(), "index.html")


@router.api_route("/dashboard/{name:path}", methods=["GET", "HEAD"])
@level(Level.READ_ONLY)
async def asset(name: str) -> Response:
    return _file(webapp_dir().resolve(), name)
