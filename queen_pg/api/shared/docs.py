"""OpenAPI for routes that parse their own bodies and query strings.

Routes read their bodies themselves (a msgspec Struct per body, ``queen_pg/api/shared/body.py``; empty bodies
allowed where the client sends none) and their query parameters through ``queen_pg/api/shared/params.py``
specs, so FastAPI can infer neither. ``body(Struct)`` documents the request body in the route decorator
(``openapi_extra=body(Struct)``) with the JSON Schema of the very Struct that decodes it, ``params(...)``
the query parameters (``Param.doc()``) and headers (``header(...)``), ``answers({200: Model}, 400, 404)``
the success models (pydantic, documentation only: answers are built as dicts) and the error statuses
(``ErrorBody``), and ``install(app)`` adds every request Struct to ``components/schemas``.

``install`` also serves the two documentation pages, ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc),
with their scripts, stylesheet and icon from the broker itself (``/docs/assets/...``, the copies the
``fastapi-offline`` wheel ships): they work with no internet, behind a firewall, in an air-gapped
cluster. FastAPI's own pages would load them from a CDN.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from fastapi import FastAPI, HTTPException, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, Response
from pydantic import BaseModel

from queen_pg import text
from queen_pg.security.web import FRAME_DENY

_MODELS: dict[str, type[msgspec.Struct]] = {}
_EXTRA: dict[str, dict[str, Any]] = {}  # JSON Schema a Struct cannot carry (``oneOf`` across fields)
_REF = "#/components/schemas/{model}"
_FASTAPI_422 = "#/components/schemas/HTTPValidationError"


class ErrorBody(BaseModel):
    """Every error: a message and a stable code (the KV, locks and timers families add reason/detail)."""

    error: str
    code: str | None = None
    reason: str | None = None
    detail: str | None = None


def body(
    model: type[msgspec.Struct],
    *,
    required: bool = True,
    parameters: tuple[Any, ...] = (),
    schema_extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``openapi_extra`` for a JSON request body: the Struct that also decodes it (``queen_pg/api/shared/body.py``),
    plus query/header ``parameters``."""
    _MODELS[model.__name__] = model
    if schema_extra:
        _EXTRA[model.__name__] = schema_extra
    schema = {"$ref": _REF.format(model=model.__name__)}
    extra: dict[str, Any] = {"requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}}
    if parameters:
        extra["parameters"] = [p.doc() if hasattr(p, "doc") else dict(p) for p in parameters]
    return extra


def params(*parameters: Any) -> dict[str, Any]:
    """``openapi_extra`` for query parameters (``params.Param`` specs, or dicts) and headers (no request body)."""
    return {"parameters": [p.doc() if hasattr(p, "doc") else dict(p) for p in parameters]}


def query(name: str, description: str, *, required: bool = False, **schema: Any) -> dict[str, Any]:
    """One query parameter; ``schema`` is JSON Schema (default ``type="string"``)."""
    return {
        "name": name,
        "in": "query",
        "required": required,
        "description": description,
        "schema": {"type": "string", **schema},
    }


def header(name: str, description: str) -> dict[str, Any]:
    """One optional request header (a string)."""
    return {"name": name, "in": "header", "required": False, "description": description, "schema": {"type": "string"}}


def answers(ok: dict[int, Any], *errors: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: its success models (``None``: an answer with no body) plus the error
    statuses it can answer (``ErrorBody``; 503 always: the database can be unavailable)."""
    out: dict[int | str, dict[str, Any]] = {}
    for status, model in ok.items():
        out[status] = {"model": model} if model is not None else {"description": "No body"}
    for status in (*errors, 503):
        out[status] = {"model": ErrorBody}
    return out


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        for value in node.values():
            found |= _refs(value)
        return found
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node)) if node else set()
    return set()


def _drop_fastapi_422(schema: dict[str, Any]) -> None:
    """FastAPI documents a 422 ``HTTPValidationError`` for every route with parameters; this app answers
    request-validation errors as 400 ``ErrorBody`` (the ``RequestValidationError`` handler in
    ``queen_pg/app.py``), and 422 only as ``idempotency_key_reused`` where ``answers`` says so."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            if _FASTAPI_422 in _refs(responses.get("422")):
                del responses["422"]
    components = schema.get("components", {}).get("schemas", {})
    if _FASTAPI_422 not in _refs(schema.get("paths", {})):
        components.pop("HTTPValidationError", None)
        if _REF.format(model="ValidationError") not in _refs(components):
            components.pop("ValidationError", None)


# Path parameters by name: FastAPI sees them as plain strings; the routes check them by these rules.
_NAME_PATH = {"type": "string", "minLength": 1, "maxLength": 255, "pattern": text.PATTERN}
_ID_PATH = {"type": "string", "minLength": 1, "pattern": text.PATTERN}
PATH_PARAMS: dict[str, dict[str, Any]] = {
    "queue": _NAME_PATH,
    "partition": _NAME_PATH,
    "group": _NAME_PATH,
    "name": _NAME_PATH,
    "partition_id": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
    "transaction_id": _ID_PATH,
    "lease_id": _ID_PATH,
    # timers: the queue (percent-encoded, so a `/` in it stays the queue's), then `/` and a timer key
    "target": {**_NAME_PATH, "maxLength": 255 + 1 + 1024},
}


def _path_params(schema: dict[str, Any]) -> None:
    """The path parameters' rules; a route with a name in its path also answers what ``check_name``
    answers beyond 255 bytes (413 ``name_too_long``, as the 400 it documents)."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            for p in operation.get("parameters", []):
                if p.get("in") == "path" and p.get("name") in PATH_PARAMS:
                    p["schema"] = dict(PATH_PARAMS[p["name"]])
                    if PATH_PARAMS[p["name"]] is _NAME_PATH and "400" in responses and "413" not in responses:
                        responses["413"] = {**responses["400"], "description": "Content Too Large"}


def install(app: FastAPI) -> None:
    built = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = built()
        if _MODELS:
            _, defs = msgspec.json.schema_components(
                list(_MODELS.values()), ref_template=_REF.replace("{model}", "{name}")
            )
            for name, extra in _EXTRA.items():
                defs[name] = {**defs[name], **extra}
            schema.setdefault("components", {}).setdefault("schemas", {}).update(defs)
        _drop_fastapi_422(schema)
        _path_params(schema)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
    _install_pages(app)


ASSETS_URL = "/docs/assets"
_MEDIA = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}


def assets_dir() -> Path:
    """Swagger UI and ReDoc as the ``fastapi-offline`` wheel ships them (located without importing it)."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the fastapi-offline package (the /docs assets) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


def _install_pages(app: FastAPI) -> None:
    """``/docs`` and ``/redoc``, every asset they reference served by this broker."""
    folder = assets_dir()
    assets = {p.name: p for p in folder.iterdir() if p.suffix in _MEDIA}
    for needed in ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png"):
        if needed not in assets:
            raise FileNotFoundError(f"{folder / needed} is missing: the /docs pages could not load")
    openapi_url = app.openapi_url or "/openapi.json"

    def page(request: Request, render: Callable[..., HTMLResponse], title: str, assets: dict[str, str],
             **options: Any) -> Response:  # fmt: skip
        """One docs page; the schema and each asset (``assets``: argument -> file) under the app's root path."""
        root = request.scope.get("root_path", "")
        urls = {arg: f"{root}{ASSETS_URL}/{name}" for arg, name in assets.items()}
        html = render(openapi_url=root + openapi_url, title=f"{app.title} - {title}", **urls, **options)
        html.headers.update(FRAME_DENY)  # no page may frame the docs (their "Try it out" sends requests)
        return html

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> Response:
        assets = {
            "swagger_js_url": "swagger-ui-bundle.js",
            "swagger_css_url": "swagger-ui.css",
            "swagger_favicon_url": "favicon.png",
        }
        return page(request, get_swagger_ui_html, "API", assets, swagger_ui_parameters=app.swagger_ui_parameters)

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> Response:
        assets = {"redoc_js_url": "redoc.standalone.js", "redoc_favicon_url": "favicon.png"}
        return page(request, get_redoc_html, "ReDoc", assets, with_google_fonts=False)

    @app.get(ASSETS_URL + "/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        path = assets.get(name)
        if path is None:
            raise HTTPException(404, f"no documentation asset {name!r}")
        return FileResponse(path, media_type=_MEDIA[path.suffix], headers={"Cache-Control": "public, max-age=86400"})
