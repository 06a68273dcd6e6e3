"""Answers of the admin routes (configure, delete a queue, health), for the OpenAPI document."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from queen_pg.api.shared.schemas import Answer

# --- queue management and health -----------------------------------------------------------------


class ConfigureAnswer(Answer):
    success: Literal[True]
    queue: str
    configured: Literal[True]
    id: int
    name: str
    namespace: str | None
    task: str | None
    options: dict[str, Any] = Field(description="the stored options, defaults filled in")
    createdAt: str


class DeleteQueueAnswer(Answer):
    success: Literal[True]
    queue: str
    deleted: bool = Field(description="false: there was no such queue")


class HealthAnswer(Answer):
    status: Literal["healthy"]
    database: Literal["up"]
    version: str


# --- resources -----------------------------------------------------------------------------------
