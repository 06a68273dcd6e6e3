"""Browser fixtures for the dashboard tests: Debian's chromium driven by Playwright for Python.

* ``chromium``: the path of ``/usr/bin/chromium``, installed with ``apt-get install -y chromium`` when
  missing (CI runs as root on a clean Debian machine). Playwright's own browser download
  (``playwright install``) is never used: the browser is the distribution's.
* ``dash``: a fresh seeded broker (tests/dashboard/seed.py) and a 1280×800 page on it that records every
  console error, page error and failed request; a test fails on any it did not expect.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from playwright.async_api import Browser, ConsoleMessage, Page, Request, async_playwright, expect

from tests.conftest import ROOT, Broker
from tests.dashboard.seed import Seeded, seed

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
SHOTS = ROOT / ".screenshots" / "dashboard"  # git-ignored
VIEWPORT = {"width": 1280, "height": 800}
expect.set_options(timeout=15_000)  # a live page refreshes every 5 s


def token(secret: str, role: str, **claims: str) -> str:
    """An HS256 token for a broker started with ``jwt_enabled=True, jwt_secret=secret`` (``claims``: more
    claims, e.g. the tenant)."""
    now = int(time.time())
    body = {"sub": f"dash-{role}", "role": role, "iat": now, "exp": now + 600, "tenant": "default", **claims}
    return jwt.encode(body, secret, algorithm="HS256")


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(["apt-get", *args], env=env, capture_output=True, text=True, timeout=540, check=False)


@pytest.fixture(scope="session")
def chromium() -> str:
    if not Path(CHROMIUM).exists():
        if shutil.which("apt-get") is None or os.geteuid() != 0:
            pytest.fail(
                f"{CHROMIUM} is missing and cannot be installed here: run `apt-get install -y chromium` as root"
            )
        got = _apt("install", "-y", "--no-install-recommends", "chromium")
        if got.returncode != 0:  # a clean machine has no package lists yet
            _apt("update")
            got = _apt("install", "-y", "--no-install-recommends", "chromium")
        assert got.returncode == 0 and Path(CHROMIUM).exists(), (
            f"apt-get install chromium failed:\n{got.stderr[-2000:]}"
        )
    return CHROMIUM


class Dash:
    """One page on one broker; ``errors`` collects what the browser complained about."""

    def __init__(self, page: Page, broker: Broker, seeded: Seeded) -> None:
        self.page = page
        self.broker = broker
        self.url = broker.url
        self.seeded = seeded
        self.errors: list[str] = []
        self.allowed: list[str] = []  # substrings of errors a test provokes on purpose
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on("requestfailed", self._failed)

    def _failed(self, req: Request) -> None:
        if req.failure != "net::ERR_ABORTED":  # a refresh in flight when the test navigates away
            self.errors.append(f"requestfailed: {req.url} {req.failure}")

    def _console(self, msg: ConsoleMessage) -> None:
        if msg.type in ("error", "assert"):
            self.errors.append(f"console.{msg.type}: {msg.text} @ {msg.location.get('url', '')}")

    async def goto(self, hash_: str) -> None:
        await self.page.goto(f"{self.url}/#{hash_}")

    async def shot(self, name: str) -> Path:
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"{name}.png"
        await self.page.screenshot(path=str(path))
        return path

    async def confirm(self) -> None:
        await self.page.get_by_test_id("confirm-ok").click()
        await expect(self.page.get_by_test_id("confirm")).to_have_count(0)

    def unexpected(self) -> list[str]:
        return [e for e in self.errors if not any(a in e for a in self.allowed)]


@pytest.fixture
async def browser(chromium: str) -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=chromium, headless=True, args=ARGS)
        yield b
        await b.close()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "broker(**settings): settings of the dashboard test's broker")


@pytest.fixture
async def dash(browser: Browser, start_broker: Any, request: pytest.FixtureRequest) -> AsyncIterator[Dash]:
    marker = request.node.get_closest_marker("broker")
    settings: dict[str, Any] = dict(marker.kwargs) if marker else {}
    broker: Broker = await start_broker(**settings)
    # with JWT on (a test's marker sets jwt_secret) the seed writes with an admin token
    seeded = await seed(broker.url, token(settings["jwt_secret"], "admin") if settings.get("jwt_enabled") else None)
    # not UTC: the pages turn local times into the UTC instants the API takes (seek to a time)
    context = await browser.new_context(viewport=VIEWPORT, timezone_id="America/Sao_Paulo")  # type: ignore[arg-type]
    page = await context.new_page()
    d = Dash(page, broker, seeded)
    yield d
    # leave the page before the broker stops: a refresh in flight would fail as the server goes away
    await page.goto("about:blank")
    await context.close()
    assert d.unexpected() == [], "the browser reported errors"
