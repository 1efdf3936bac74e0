"""A faster HTTP client for the managed engines' calls to their local server: aiohttp's, behind
the small part of httpx's interface the OpenAI-protocol code uses.

``managed.server_client`` makes one per loaded server replica.  The benchmarks measure it
(bench/asgi_relay.py, bench/upstream_client.py) and tests/managed/test_upstream_client.py checks it.
A client that leaves a non-streamed pass-through request frees llama-server's slot because
``runtime.backends.shared.forwarding`` streams such a request from llama-server, not because of this client.

Why not httpx: on this hot path (every request to a managed server) httpx costs about 0.57 ms
of CPU per call, aiohttp's client about 0.13 ms (docs/performance.md, bench/upstream_client.py).
The chat, completions and embeddings code (``openai_chat``, ``forwarding``,
``openai_embeddings``) is shared with ``openai_remote``, which keeps httpx (remote, TLS, file
uploads), so this client answers the same calls: ``post(path, json=...)`` and
``stream("POST", path, json=...)``, responses with ``status_code``, ``content``, ``json()``,
``aread()`` and ``aiter_lines()``, and transport failures raised as httpx's own
(``httpx.ConnectError``, ``ReadError``, ``RemoteProtocolError``, ``TimeoutException``), which the
engines already handle.

Kept-alive connections: a non-streamed answer's connection goes back to the pool (dropped after
``keepalive_seconds`` idle, before llama-server's own 5 s keep-alive ends); a streamed request
goes out on a session that never pools (``Connection: close``, aiohttp's ``force_close``), so
its connection is closed when the stream ends.  llama-server closes a connection right after
a stream (its content provider returns false once it has ended the stream, which cpp-httplib
reads as a cancelled response, so it drops the connection it had offered to keep alive), and a
pooled one would then fail the next request that takes it before the close is seen (117 of 300
calls, docs/performance.md).  A stream costs one new loopback connection instead (tens of
microseconds against a stream's seconds).  A server's ``Connection: close`` is honoured by
aiohttp itself (the connection is not reused).
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx

from runtime.json_codec import dumps, loads

JSON_HEADERS = {"Content-Type": "application/json"}


class UpstreamResponse:
    """A finished (non-streamed) answer, or the head of a streamed one."""

    def __init__(self, status_code: int, headers, content: bytes = b"", stream: aiohttp.ClientResponse | None = None):
        self.status_code = status_code
        self.headers = headers
        self.content = content
        self._stream = stream

    def json(self) -> Any:
        return loads(self.content)

    async def aread(self) -> bytes:
        if self._stream is not None:
            self.content = await _read(self._stream)
        return self.content

    async def aiter_lines(self) -> AsyncIterator[str]:
        """The body's lines, decoded, without their ``\\n`` / ``\\r\\n`` (as httpx's)."""
        assert self._stream is not None
        pending = b""
        try:
            async for piece in self._stream.content.iter_any():
                pending += piece
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.rstrip(b"\r").decode("utf-8", "replace")
        except aiohttp.ClientError as exc:
            raise _transport_error(exc) from exc
        except asyncio.TimeoutError as exc:
            raise httpx.ReadTimeout(str(exc) or "read timed out") from exc
        if pending:
            yield pending.rstrip(b"\r").decode("utf-8", "replace")


class UpstreamClient:
    """A pooled client for one base URL (see the module docstring)."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, *, connect_timeout: float = 10.0,
                 keepalive_seconds: float = 2.0):
        self.base_url = base_url.rstrip("/")
        self._headers = dict(headers or {})
        self._connect_timeout = connect_timeout
        self._keepalive_seconds = keepalive_seconds
        self._sessions: dict[bool, aiohttp.ClientSession] = {}

    def _open(self, streamed: bool = False) -> aiohttp.ClientSession:
        """The pooled session, or (``streamed``) the one that never pools: its requests say
        ``Connection: close`` and their connection is closed when the answer ends.  Created on
        first use, on the running loop (aiohttp binds a session to its loop)."""
        session = self._sessions.get(streamed)
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=None if streamed else self._keepalive_seconds,
                                             force_close=streamed, socket_factory=_resetting_socket)
            session = self._sessions[streamed] = aiohttp.ClientSession(
                connector=connector,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout),
                trust_env=False,
                # A local server's answers: no cookies kept or sent, none compressed (no
                # Accept-Encoding is sent, so none is decoded): about 25 µs of CPU a call less.
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        return session

    def _url(self, path: str) -> str:
        return path if path.startswith(("http://", "https://")) else f"{self.base_url}/{path.lstrip('/')}"

    async def post(self, path: str, *, json: Any = None, content: bytes | None = None,
                   headers: dict[str, str] | None = None) -> UpstreamResponse:
        data, sent_headers = _body(json, content, headers)
        try:
            async with self._open().post(self._url(path), data=data, headers=sent_headers) as response:
                return UpstreamResponse(response.status, response.headers, await _read(response))
        except aiohttp.ClientError as exc:
            raise _transport_error(exc) from exc
        except asyncio.TimeoutError as exc:
            raise httpx.ReadTimeout(str(exc) or "timed out") from exc

    @contextlib.asynccontextmanager
    async def stream(self, method: str, path: str, *, json: Any = None, content: bytes | None = None,
                     headers: dict[str, str] | None = None) -> AsyncIterator[UpstreamResponse]:
        """A streamed answer; its connection is closed when the block ends (never pooled)."""
        data, sent_headers = _body(json, content, headers)
        try:
            response = await self._open(streamed=True).request(method, self._url(path), data=data, headers=sent_headers)
        except aiohttp.ClientError as exc:
            raise _transport_error(exc) from exc
        except asyncio.TimeoutError as exc:
            raise httpx.ConnectTimeout(str(exc) or "timed out") from exc
        try:
            yield UpstreamResponse(response.status, response.headers, stream=response)
        finally:
            response.close()

    async def aclose(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await session.close()


def _resetting_socket(addr_info) -> socket.socket:
    """A socket whose close resets the connection (SO_LINGER 0), as httpx's (anyio's) close does.

    A request cancelled while the server generates (its client left) closes its connection, and
    the server learns it at its next look at the socket; a reset is seen as surely as a FIN there,
    and leaves no connection in TIME_WAIT on either side.  Every close here is of a connection
    nothing more is read from, so a reset loses nothing."""
    family, kind, proto, _, _ = addr_info
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return sock


def _body(json_value: Any, content: bytes | None, headers: dict[str, str] | None) -> tuple[bytes | None, dict]:
    if json_value is not None:
        return dumps(json_value), {**JSON_HEADERS, **(headers or {})}
    return content, dict(headers or {})


async def _read(response: aiohttp.ClientResponse) -> bytes:
    try:
        return await response.read()
    except aiohttp.ClientError as exc:
        raise _transport_error(exc) from exc


def _transport_error(exc: aiohttp.ClientError) -> httpx.TransportError:
    """aiohttp's failure as the httpx error the engines handle (all of them TransportErrors)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(str(exc))
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
        return httpx.RemoteProtocolError(str(exc) or type(exc).__name__)
    if isinstance(exc, aiohttp.ClientOSError):
        return httpx.ReadError(str(exc))
    return httpx.RemoteProtocolError(f"{type(exc).__name__}: {exc}")
