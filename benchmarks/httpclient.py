"""A minimal HTTP/1.1 client on raw asyncio streams, for the load generator.

One keep-alive connection; a request is pre-built bytes and the answer is (status, body). It reads
Content-Length and chunked bodies and reconnects after ``Connection: close`` or an error; nothing else
(no redirects, no TLS): it talks to our own broker only, and costs a fraction of a general client.
"""

from __future__ import annotations

import asyncio
import socket


class HttpError(Exception):
    pass


class Conn:
    """One keep-alive HTTP/1.1 connection; a request is pre-built bytes, the answer (status, body)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 20)
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            await self.connect()
        assert self.reader is not None and self.writer is not None
        try:
            self.writer.write(raw)
            r = self.reader
            head = await r.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            low = head.lower()
            i = low.find(b"\r\ncontent-length:")
            if i >= 0:
                n = int(low[i + 17 : low.find(b"\r\n", i + 17)])
                body = await r.readexactly(n) if n else b""
            elif b"\r\ntransfer-encoding: chunked" in low:
                body = await self._chunked(r)
            else:
                body = b""
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            self.close()
            raise HttpError(f"{exc.__class__.__name__}: {exc}") from None
        if b"\r\nconnection: close" in low:
            self.close()
        return status, body

    @staticmethod
    async def _chunked(r: asyncio.StreamReader) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int((await r.readuntil(b"\r\n")).split(b";")[0], 16)
            data = await r.readexactly(size + 2)
            if size == 0:
                return b"".join(parts)
            parts.append(data[:-2])


def raw_request(method: str, path: str, body: bytes | None = None, ctype: bytes = b"application/json") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n".encode()
    if body is None:
        return head + b"\r\n"
    return head + b"Content-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (ctype, len(body), body)
