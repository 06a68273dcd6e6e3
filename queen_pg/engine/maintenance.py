"""Maintenance switches: stored in ``queen.system_settings``, cached in every broker process.

``push`` on: pushes and transactions that push are refused (503 ``maintenance``, ``Retry-After``).
``pop`` on: pops answer empty (204) at once. Each process keeps a :class:`Maintenance` cache that the
refresher (``queen_pg/jobs/maintenance.py``) re-reads at least once a second, so a switch flipped on
one replica is obeyed by all of them within a second; the replica that flips it updates its own cache
at once. One procedure call per function (``sql/procedures/130_system.sql``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from queen_pg.db.pool import Database
from queen_pg.engine import calls

PUSH_KEY = "maintenance.push"
POP_KEY = "maintenance.pop"
Switch = Literal["push", "pop"]
KEYS: dict[Switch, str] = {"push": PUSH_KEY, "pop": POP_KEY}


@dataclass(slots=True)
class Maintenance:
    """This process's view of the switches (off until the first read)."""

    push: bool = False
    pop: bool = False
    updated_at: str | None = None  # when a switch last changed (ISO), as stored
    read_at: float = 0.0  # time.monotonic() of the last successful read; 0 = never

    def apply(self, settings: dict[str, Any]) -> None:
        self.push = settings.get(PUSH_KEY) is True
        self.pop = settings.get(POP_KEY) is True
        self.updated_at = settings.get("updatedAt")
        self.read_at = time.monotonic()

    def answer(self) -> dict[str, Any]:
        """The JSON the maintenance routes answer (Queen 0.x names: maintenanceMode, popMaintenanceMode)."""
        return {
            "maintenanceMode": self.push,
            "popMaintenanceMode": self.pop,
            "push": self.push,
            "pop": self.pop,
            "updatedAt": self.updated_at,
        }


async def read(db: Database) -> dict[str, Any]:
    """Every stored switch: ``{"maintenance.push": bool, ..., "updatedAt": iso | None}``."""
    result: dict[str, Any] = orjson.loads(await db.fetchval(calls.SYSTEM_SETTINGS))
    return result


async def refresh(db: Database, cache: Maintenance) -> None:
    cache.apply(await read(db))


async def set_switch(db: Database, cache: Maintenance, switch: Switch, enabled: bool) -> None:
    """Store a switch and apply the stored state to this process's cache at once."""
    cache.apply(orjson.loads(await db.fetchval(calls.SYSTEM_SETTING_SET, KEYS[switch], orjson.dumps(enabled).decode())))
