"""``/docs`` and ``/redoc`` work with no internet: every script, stylesheet and icon they reference is
served by the broker itself, and the pages name no other host."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import httpx
import pytest


class Refs(HTMLParser):
    """The URLs a page makes the browser load: ``<script src>``, ``<link href>``, ``<img src>``."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        for attr in ("src", "href"):
            if tag in ("script", "link", "img") and found.get(attr):
                self.urls.append((tag, str(found[attr])))


def refs(html: str) -> list[tuple[str, str]]:
    parser = Refs()
    parser.feed(html)
    return parser.urls


@pytest.mark.parametrize(("page", "kinds"), [("/docs", {"script", "link"}), ("/redoc", {"script", "link"})])
async def test_every_asset_of_the_page_comes_from_the_broker(
    http: httpx.AsyncClient, page: str, kinds: set[str]
) -> None:
    r = await http.get(page)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/html")
    assert "/openapi.json" in r.text
    found = refs(r.text)
    assert kinds <= {tag for tag, _ in found}, found
    # no CDN, no web fonts: nothing on the page names another host
    assert not re.findall(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", r.text), "the page loads from another host"
    for tag, url in found:
        assert url.startswith("/"), f"{tag} {url}: not served by the broker"
        asset = await http.get(url)
        assert asset.status_code == 200, (url, asset.status_code)
        assert len(asset.content) > 0, url
        expected = {"script": "text/javascript", "link": ("text/css", "image/png")}[tag]
        assert asset.headers["content-type"].startswith(expected), (url, asset.headers["content-type"])
    scripts = [url for tag, url in found if tag == "script"]
    big = [len((await http.get(url)).content) for url in scripts]
    assert max(big) > 100_000, "the UI bundle itself (hundreds of KiB), not a stub"


async def test_the_swagger_ui_renders_openapi_3_1(http: httpx.AsyncClient) -> None:
    """FastAPI writes OpenAPI 3.1; Swagger UI before 5 refuses it ("does not specify a valid version")."""
    doc = (await http.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.1")
    bundle = (await http.get("/docs/assets/swagger-ui-bundle.js")).text
    (version,) = set(re.findall(r'PACKAGE_VERSION:"(\d+)\.\d+\.\d+"', bundle))
    assert int(version) >= 5, f"Swagger UI {version}.x cannot render OpenAPI 3.1"
    assert "isOAS31" in bundle


@pytest.mark.parametrize(
    "path", ["/docs/assets/core.py", "/docs/assets/..%2Fcore.py", "/docs/assets/%2e%2e%2f__init__.py", "/docs/assets/x"]
)
async def test_only_the_assets_are_served(http: httpx.AsyncClient, path: str) -> None:
    r = await http.get(path)
    assert r.status_code == 404, (path, r.status_code, r.text[:200])
    assert r.json()["code"] == "not_found"
