"""`sandhive run --save-exchanges`: every model request and response, exactly as sent and
received, written as `request_NNN.json` / `response_NNN.json` next to `trajectory.json`.

The package's `--save_litellm_response` dumps litellm's view of each call; this records
the HTTP exchange itself (below the model clients, so retries and the recovery's
smaller `max_tokens` show as the calls they were). Credentials never reach the files:
the headers that carry keys are masked. Imported only by `app.runner.local`.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

SECRET_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "proxy-authorization"})


@dataclass
class Exchange:
    request: dict[str, Any]
    status: int
    headers: dict[str, str]
    chunks: list[bytes] = field(default_factory=list)

    def response(self) -> dict[str, Any]:
        """The response as received: its JSON body, or the raw text of an event stream."""
        raw = _decoded(b"".join(self.chunks), self.headers.get("content-encoding", ""))
        text = raw.decode("utf-8", errors="replace")
        out: dict[str, Any] = {"status": self.status, "headers": self.headers}
        try:
            out["body"] = json.loads(text)
        except json.JSONDecodeError:
            out["text"] = text
        return out


class ExchangeLog:
    """The exchanges of one run, in the order they were made."""

    def __init__(self) -> None:
        self.exchanges: list[Exchange] = []

    def client(self) -> httpx.AsyncClient:
        """An HTTP client like `shared_http_client()` (no cookies) that records through this log."""
        import http.cookiejar

        no_cookies = http.cookiejar.CookieJar(
            http.cookiejar.DefaultCookiePolicy(allowed_domains=[])
        )
        return httpx.AsyncClient(cookies=no_cookies, transport=_Recording(self))

    def write(self, folder: Path) -> int:
        """The files, numbered from 001 as the package numbers them; returns how many."""
        for number, item in enumerate(self.exchanges, start=1):
            for name, content in (("request", item.request), ("response", item.response())):
                path = folder / f"{name}_{number:03d}.json"
                path.write_text(json.dumps(content, indent=2, ensure_ascii=False), "utf-8")
        return len(self.exchanges)


class _Recording(httpx.AsyncBaseTransport):
    def __init__(self, log: ExchangeLog) -> None:
        self._log = log
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        sent = await request.aread()
        response = await self._inner.handle_async_request(request)
        item = Exchange(
            request={
                "method": request.method,
                "url": str(request.url),
                "headers": _masked(request.headers),
                "body": _json_or_text(sent),
            },
            status=response.status_code,
            headers=_masked(response.headers),
        )
        self._log.exchanges.append(item)
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_Tee(response.stream, item),
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Tee(httpx.AsyncByteStream):
    """The response body, passed on unchanged and kept (raw, as it came off the wire)."""

    def __init__(self, inner: httpx.SyncByteStream | httpx.AsyncByteStream, item: Exchange):
        assert isinstance(inner, httpx.AsyncByteStream)
        self._inner, self._item = inner, item

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._item.chunks.append(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def _masked(headers: httpx.Headers) -> dict[str, str]:
    return {
        key: ("***" if key.lower() in SECRET_HEADERS else value)
        for key, value in headers.multi_items()
    }


def _json_or_text(raw: bytes) -> Any:
    text = raw.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _decoded(raw: bytes, encoding: str) -> bytes:
    """The body as the client read it: gzip and deflate undone (others are kept as they are)."""
    if encoding.strip().lower() in ("gzip", "deflate"):
        try:
            return zlib.decompress(raw, 47)  # 32 + 15: a gzip or zlib header, detected
        except zlib.error:
            return raw
    return raw
