"""The aiohttp-based upstream client (runtime/backends/shared/upstream.py) against a raw local server.

The managed engines' client (managed.server_client); the managed tests run it against real
servers, these against a raw one that does what those may do.

What it must do that a plain aiohttp session did not: never hand a request a kept-alive
connection that the server closed after a stream (llama-server may close right after one),
honour ``Connection: close``, and fail as the httpx errors the engines handle.
"""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from runtime.backends.shared.upstream import UpstreamClient

def upstream_client(url: str) -> UpstreamClient:
    return UpstreamClient(url, connect_timeout=10.0, keepalive_seconds=2.0)


ANSWER = json.dumps({"choices": [{"message": {"content": "yes"}}]}).encode()


class RawServer:
    """An HTTP/1.1 server on a free port that counts connections; ``behaviour`` picks its answers."""

    def __init__(self, behaviour: str = "keep"):
        self.behaviour = behaviour
        self.connections = 0
        self.requests: list[tuple[str, dict, bytes]] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *fields = head.decode().split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields if f)}
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                self.requests.append((line, headers, body))
                if not await self._answer(writer, json.loads(body) if body else {}):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, request: dict) -> bool:
        """Write the answer; False closes the connection."""
        if self.behaviour == "cut":  # the head, then half the promised body, then gone
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\"")
            await writer.drain()
            return False
        if request.get("stream"):
            events = b"".join(b"data: %s\n\n" % json.dumps({"n": i, "pad": "x" * request.get("pad", 0)}).encode()
                              for i in range(3)) + b"data: [DONE]\n\n"
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for piece in (events[i:i + 7] for i in range(0, len(events), 7)):  # lines split across chunks
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            # As llama-server may: close right after a stream, without saying so.
            return self.behaviour != "close_after_stream"
        close = self.behaviour == "connection_close"
        extra = b"Connection: close\r\n" if close else b""
        if self.behaviour == "set_cookie":  # a server that hands out a session cookie
            extra += b"Set-Cookie: session=abc; Path=/\r\n"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
            len(ANSWER), extra, ANSWER))
        await writer.drain()
        return not close


async def streamed_lines(client: UpstreamClient, **body) -> list[str]:
    async with client.stream("POST", "/v1/chat/completions", json={"stream": True, **body}) as response:
        assert response.status_code == 200
        return [line async for line in response.aiter_lines()]


async def test_non_streamed_calls_share_one_kept_alive_connection():
    async with RawServer() as server:
        client = upstream_client(server.url)
        try:
            for _ in range(5):
                answer = await client.post("/v1/chat/completions", json={"model": "m"})
                assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "yes"
        finally:
            await client.aclose()
        assert server.connections == 1
        line, headers, body = server.requests[0]
        assert line == "POST /v1/chat/completions HTTP/1.1"
        assert headers["content-type"] == "application/json" and json.loads(body) == {"model": "m"}


async def test_no_cookie_is_kept_and_no_compressed_answer_is_asked_for():
    """A local server's calls carry no cookie it set and no Accept-Encoding (the client decodes
    none: it keeps no cookie jar and leaves decompression off, which costs less per call)."""
    async with RawServer("set_cookie") as server:
        client = upstream_client(server.url)
        try:
            for _ in range(2):
                assert (await client.post("/v1/chat/completions", json={"model": "m"})).json()["choices"]
            await streamed_lines(client)
        finally:
            await client.aclose()
    assert len(server.requests) == 3
    for _, headers, _ in server.requests:
        assert "cookie" not in headers and "accept-encoding" not in headers, headers


async def test_a_streamed_answer_connection_is_never_pooled():
    """Each stream on a fresh connection, closed after; a non-streamed call after a stream does
    not inherit the stream's connection."""
    async with RawServer() as server:
        client = upstream_client(server.url)
        try:
            for _ in range(3):
                lines = await streamed_lines(client)
                assert [line for line in lines if line] == [
                    'data: {"n": 0, "pad": ""}', 'data: {"n": 1, "pad": ""}', 'data: {"n": 2, "pad": ""}', "data: [DONE]"]
            assert server.connections == 3
            await client.post("/v1/chat/completions", json={})
            await client.post("/v1/chat/completions", json={})
            assert server.connections == 4
        finally:
            await client.aclose()


async def test_a_server_that_closes_after_each_stream_fails_no_request():
    """The failure that made a plain aiohttp pool unusable (117 of 300 first attempts): streams
    and calls in turn against a server that closes right after every stream, without a retry."""
    async with RawServer("close_after_stream") as server:
        client = upstream_client(server.url)
        try:
            for _ in range(30):
                await streamed_lines(client)
                assert (await client.post("/v1/chat/completions", json={})).status_code == 200
        finally:
            await client.aclose()
        assert len(server.requests) == 60


async def test_connection_close_is_honoured():
    async with RawServer("connection_close") as server:
        client = upstream_client(server.url)
        try:
            for _ in range(4):
                assert (await client.post("/v1/chat/completions", json={})).json()["choices"]
        finally:
            await client.aclose()
        assert server.connections == 4


async def test_long_lines_and_split_chunks_come_out_whole():
    """A line over 64 KiB (aiohttp's own readline limit) and lines split across chunks."""
    async with RawServer() as server:
        client = upstream_client(server.url)
        try:
            lines = [line for line in await streamed_lines(client, pad=100_000) if line]
        finally:
            await client.aclose()
        assert len(lines) == 4 and all(len(line) > 100_000 for line in lines[:3])
        assert json.loads(lines[2][6:])["n"] == 2


async def test_failures_are_the_httpx_errors_the_engines_handle():
    async with RawServer() as server:
        closed_url = server.url
    client = upstream_client(closed_url)  # nothing listens there any more
    try:
        with pytest.raises(httpx.ConnectError):
            await client.post("/v1/chat/completions", json={})
        with pytest.raises(httpx.ConnectError):
            async with client.stream("POST", "/v1/chat/completions", json={"stream": True}):
                pass
    finally:
        await client.aclose()
    async with RawServer("cut") as server:
        client = upstream_client(server.url)
        try:
            with pytest.raises(httpx.TransportError):
                await client.post("/v1/chat/completions", json={})
        finally:
            await client.aclose()
