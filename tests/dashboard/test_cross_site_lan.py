"""A web page cannot pop from a broker it reaches over plain http on a non-loopback address.

Browsers send Fetch Metadata (``Sec-Fetch-Site``) only to potentially trustworthy origins, and no
``Origin`` on a GET that is not a CORS request: an ``<img>`` (a script, an iframe, a form GET, a no-cors
fetch) on any site pointing at ``http://<lan-ip>:6632/api/v1/pop/...`` carries neither. The broker here
is bound to this machine's own non-loopback address with JWT off, the attacking page is served from
another origin, and Debian's chromium loads it (tests/dashboard/conftest.py). Every vector must be
refused (403 ``cross_site``) and leave the queue as it was: a client that is not a browser then pops
every message.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, Request, Response

from tests.conftest import Broker, broker_settings
from tests.helpers import pop, push

pytestmark = pytest.mark.timeout(300)  # the first browser test may install chromium (apt-get)

ATTACKS: dict[str, str] = {
    "img": '<img src="{url}&autoAck=true">',
    "script": '<script src="{url}&autoAck=false"></script>',  # leases (no ack)
    "iframe": '<iframe src="{url}&autoAck=true"></iframe>',
    "form": '<form method="get" action="{base}"><input name="batch" value="100"><input name="wait" value="false">'
    '<input name="autoAck" value="true"></form><script>document.forms[0].submit()</script>',
    "fetch": '<script>fetch("{url}&autoAck=true", {{mode: "no-cors"}})</script>',
    "head": '<script>fetch("{url}&autoAck=true", {{method: "HEAD", mode: "no-cors"}})</script>',
    # a page cannot pass for a client that is not a browser: a no-cors request drops these headers
    "agent": '<script>fetch("{url}&autoAck=true", {{mode: "no-cors", '
    'headers: {{"User-Agent": "python-httpx/0.28", "Accept": "application/json"}}}})</script>',
}


def lan_address() -> str:
    """This machine's address on its default route: not loopback, so a browser does not trust it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("203.0.113.1", 9))  # no packet is sent: the kernel only picks the route's source address
        address = str(s.getsockname()[0])
    assert not address.startswith("127."), f"no non-loopback IPv4 address on this machine ({address})"
    return address


async def _page_server(pages: dict[str, str]) -> tuple[asyncio.Server, str]:
    """A plain HTTP server on 127.0.0.1 (another origin than the broker's) answering ``/<name>`` with
    ``pages[name]``."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        path = head.split(b" ", 2)[1].decode().lstrip("/")
        body = pages.get(path, "").encode()
        status = b"200 OK" if path in pages else b"404 Not Found"
        writer.write(
            b"HTTP/1.1 " + status + b"\r\ncontent-type: text/html\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


@pytest.fixture
async def lan_broker(db_url: str) -> AsyncIterator[Broker]:
    address = lan_address()
    b = Broker(broker_settings(db_url, host=address), bind=address)  # JWT off, the default
    await b.start()
    yield b
    await b.stop()


async def test_a_web_page_cannot_pop_from_a_broker_on_a_lan_address(browser: Browser, lan_broker: Broker) -> None:
    pages = {
        name: "<!doctype html><title>a page</title>"
        + html.format(
            url=f"{lan_broker.url}/api/v1/pop/queue/{name}?batch=100&wait=false",
            base=f"{lan_broker.url}/api/v1/pop/queue/{name}",
        )
        for name, html in ATTACKS.items()
    }
    server, origin = await _page_server(pages)
    context = await browser.new_context()
    try:
        async with httpx.AsyncClient(base_url=lan_broker.url, timeout=30) as http:
            for name in ATTACKS:
                await push(http, name, [{"payload": {"n": i}, "transactionId": f"{name}-{i}"} for i in range(3)])
            page = await context.new_page()
            seen: dict[str, tuple[int, str]] = {}
            for name in ATTACKS:
                done: asyncio.Future[Request] = asyncio.get_running_loop().create_future()

                def settled(r: Request, name: str = name, done: asyncio.Future[Request] = done) -> None:
                    if f"/api/v1/pop/queue/{name}" in r.url and not done.done():
                        done.set_result(r)

                # a JSON answer to an <img> or <script> is blocked by the browser (ORB) after it arrived:
                # "requestfailed", the broker has answered all the same
                page.on("requestfinished", settled)
                page.on("requestfailed", settled)
                await page.goto(f"{origin}/{name}", wait_until="commit")
                request = await asyncio.wait_for(done, 30)
                page.remove_listener("requestfinished", settled)
                page.remove_listener("requestfailed", settled)
                sent = await request.all_headers()
                # the hole's shape: the browser marked nothing (no Fetch Metadata, no Origin)
                assert "sec-fetch-site" not in sent and "origin" not in sent, (name, sent)
                assert sent["user-agent"].startswith("Mozilla/"), (name, sent)
                answer = await request.response()
                if answer is not None and request.failure is None:  # an iframe, a form: the answer is seen
                    seen[name] = (answer.status, await _text(answer))
            # nothing was acked and nothing is leased: a client that is not a browser gets every message
            for name in ATTACKS:
                got_back = await pop(http, name, batch=100, wait=False)
                assert got_back is not None, f"{name}: the page consumed or leased the messages"
                assert sorted(m["transactionId"] for m in got_back["messages"]) == [f"{name}-{i}" for i in range(3)]
            assert set(seen) == {"iframe", "form"}, seen  # the browser showed these answers
            for name, (status, text) in seen.items():
                assert status == 403 and '"code":"cross_site"' in text, (name, status, text)
    finally:
        await context.close()
        server.close()
        await server.wait_closed()


async def _text(answer: Response) -> str:
    read: Callable[[], Awaitable[Any]] = answer.text
    try:
        return str(await read())
    except Exception as exc:  # an answer the browser did not keep (a script's body)
        return f"<no body: {exc}>"
