"""OpenAPI for routes that parse their own bodies and query strings.

Most routes read the body themselves (orjson/pydantic ``model_validate_json``, empty bodies allowed
where the client sends none) and their query parameters by hand (``q_int``, ``q_bool``), so FastAPI
can infer neither. ``body(Model)`` documents the request body in the route decorator
(``openapi_extra=body(Model)``), ``params(...)`` the query parameters and headers (``query(...)``,
``header(...)``), ``answers({200: Model}, 400, 404)`` the success models and the error statuses
(``ErrorBody``), and ``install(app)`` adds every documented request model to ``components/schemas``.
The request models are documentation only: validation stays where it is.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
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
