"""OpenAPI for routes that parse their own bodies.

Most routes read the body themselves (orjson/pydantic ``model_validate_json``, empty bodies allowed
where the client sends none), so FastAPI cannot infer the request schema. ``body(Model)`` documents it
in the route decorator (``openapi_extra=body(Model)``), ``answers({200: Model})`` documents the
responses, and ``install(app)`` adds every documented model to ``components/schemas``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

_MODELS: dict[str, type[BaseModel]] = {}
_REF = "#/components/schemas/{model}"


class ErrorBody(BaseModel):
    """Every error: a message and a stable code (the KV, locks and timers families add reason/detail)."""

    error: str
    code: str | None = None
    reason: str | None = None
    detail: str | None = None


def body(model: type[BaseModel], *, required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` for a JSON request body validated by ``model``."""
    _MODELS[model.__name__] = model
    schema = {"$ref": _REF.format(model=model.__name__)}
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}}


def answers(ok: dict[int, Any], *errors: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: its success models plus the error statuses it can answer."""
    out: dict[int | str, dict[str, Any]] = {status: {"model": model} for status, model in ok.items()}
    for status in (*errors, 503):
        out[status] = {"model": ErrorBody}
    return out


def install(app: FastAPI) -> None:
    built = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = built()
        if _MODELS:
            _, defs = models_json_schema([(m, "validation") for m in _MODELS.values()], ref_template=_REF)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
