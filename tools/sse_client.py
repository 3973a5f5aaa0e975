"""A minimal asyncio HTTP/1.1 client for server-sent event streams.

Used by kvserve_bench.py --backend openai and http_stream_loadtest.py, so
neither needs an HTTP package: one connection per request (Connection:
close), a JSON POST, and the response body read as it arrives (chunked or
close-delimited), split into SSE `data:` payloads, each stamped with
time.perf_counter() when its bytes arrived.
"""

import asyncio
import json
import time


class HttpError(Exception):
    def __init__(self, status, body):
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status, self.body = status, body


async def _read_head(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise HttpError(0, head)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers


async def _body_pieces(reader, headers):
    """Yields body bytes as they arrive (de-chunked)."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return
            data = await reader.readexactly(size)
            await reader.readexactly(2)
            yield data
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


def request_bytes(host, port, path, body, method="POST"):
    payload = json.dumps(body).encode() if body is not None else b""
    hdr = (f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
           "Accept: text/event-stream\r\nConnection: close\r\n")
    if body is not None:
        hdr += ("Content-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n")
    return hdr.encode() + b"\r\n" + payload


async def stream_events(host, port, path, body, connect_timeout=30.0):
    """Async generator of (perf_counter time, data payload str) per SSE event.

    Raises HttpError for a non-2xx status (with the body), OSError /
    asyncio.IncompleteReadError on connection failures.
    """
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port), connect_timeout)
    try:
        writer.write(request_bytes(host, port, path, body))
        await writer.drain()
        status, headers = await _read_head(reader)
        if not 200 <= status < 300:
            chunks = [c async for c in _body_pieces(reader, headers)]
            raise HttpError(status, b"".join(chunks).decode("utf-8",
                                                           "replace"))
        buf = b""
        async for piece in _body_pieces(reader, headers):
            now = time.perf_counter()
            buf += piece
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if line.startswith(b"data:"):
                        yield now, line[5:].strip().decode("utf-8", "replace")
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (OSError, ConnectionError):
            pass


async def get_json(host, port, path, timeout=10.0):
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port), timeout)
    try:
        writer.write(request_bytes(host, port, path, None, method="GET"))
        await writer.drain()
        status, headers = await asyncio.wait_for(_read_head(reader), timeout)
        body = b"".join([c async for c in _body_pieces(reader, headers)])
        if not 200 <= status < 300:
            raise HttpError(status, body.decode("utf-8", "replace"))
        return json.loads(body)
    finally:
        writer.close()
