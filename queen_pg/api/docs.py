"""OpenAPI for routes that parse their own bodies and query strings.

Most routes read the body themselves (orjson/pydantic ``model_validate_json``, empty bodies allowed
where the client sends none) and their query parameters by hand (``q_int``, ``q_bool``), so FastAPI
can infer neither. ``body(Model)`` documents the request body in the route decorator
(``openapi_extra=body(Model)``), ``params(...)`` the query parameters and headers (``query(...)``,
``header(...)``), ``answers({200: Model}, 400, 404)`` the success models and the error statuses
(``ErrorBody``), and ``install(app)`` adds every documented request model to ``components/schemas``.
The request models are documentation only: validation stays where it is.

``install`` also serves the two documentation pages, ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc),
with their scripts, stylesheet and icon from the broker itself (``/docs/assets/...``, the copies the
``fastapi-offline`` wheel ships): they work with no internet, behind a firewall, in an air-gapped
cluster. FastAPI's own pages would load them from a CDN.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, Response
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

_MODELS: dict[str, type[BaseModel]] = {}
_REF = "#/components/schemas/{model}"
_FASTAPI_422 = "#/components/schemas/HTTPValidationError"


class ErrorBody(BaseModel):
    """Every error: a message and a stable code (the KV, locks and timers families add reason/detail)."""

    error: str
    code: str | None = None
    reason: str | None = None
    detail: str | None = None


def body(
    model: type[BaseModel], *, required: bool = True, parameters: tuple[dict[str, Any], ...] = ()
) -> dict[str, Any]:
    """``openapi_extra`` for a JSON request body validated by ``model`` (plus query/header ``parameters``)."""
    _MODELS[model.__name__] = model
    schema = {"$ref": _REF.format(model=model.__name__)}
    extra: dict[str, Any] = {"requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}}
    if parameters:
        extra["parameters"] = [dict(p) for p in parameters]
    return extra


def params(*parameters: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` for query parameters and headers read by hand (no request body)."""
    return {"parameters": [dict(p) for p in parameters]}


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


def install(app: FastAPI) -> None:
    built = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = built()
        if _MODELS:
            _, defs = models_json_schema([(m, "validation") for m in _MODELS.values()], ref_template=_REF)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
        _drop_fastapi_422(schema)
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

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> Response:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - API",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            swagger_ui_parameters=app.swagger_ui_parameters,
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> Response:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )

    @app.get(ASSETS_URL + "/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        path = assets.get(name)
        if path is None:
            raise HTTPException(404, f"no documentation asset {name!r}")
        return FileResponse(path, media_type=_MEDIA[path.suffix], headers={"Cache-Control": "public, max-age=86400"})
