"""The tests of ``make ha`` run only when asked (QUEEN_HA=1): ``make ha-smoke`` (~1-2 min) and
``make chaos-ha`` (~3-4 min). Each starts etcd, three Patroni-managed PostgreSQL nodes, two brokers and
HAProxy with deploy/ha/run.py, from empty directories."""

import os
from pathlib import Path

import pytest

from tests.conftest import searchable

collect_ignore = [] if os.environ.get("QUEEN_HA") else ["test_ha_smoke.py", "test_chaos_ha.py"]


@pytest.fixture(scope="session")
def patroni_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One Patroni virtualenv for every run (installed by the first), where the postgres account can reach it."""
    return searchable(tmp_path_factory.mktemp("patroni")) / "venv"


@pytest.fixture(autouse=True)
def _quiet_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUEEN_SDK_POP_AUTOPILOT", raising=False)
