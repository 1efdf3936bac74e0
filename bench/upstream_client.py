"""CPU time per call of the upstream HTTP clients a managed engine could use, against a local server.

One process, one event loop: a minimal HTTP/1.1 server answering a chat completion, and the
clients calling it over a kept-alive connection in turn: ``httpx`` (httpcore over anyio,
``openai_remote``'s client), ``httpcore`` alone (httpx's transport, without httpx's client layer),
``aiohttp`` (its client, bare) and ``upstream`` (``runtime.backends.shared.upstream.UpstreamClient``:
aiohttp's behind httpx's interface, the managed engines' client).  Each figure includes the test server's share (the same for
all).  Prints one JSON object.
Run: .venv/bin/python bench/upstream_client.py [--calls 3000]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp
import httpcore
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.backends.shared.upstream import UpstreamClient  # noqa: E402

ANSWER = json.dumps({
    "id": "chatcmpl-1", "object": "chat.completion", "model": "smol",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Yes"}, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 30, "completion_tokens": 1, "total_tokens": 31},
}).encode()
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER)
BODY = {"model": "smol", "messages": [{"role": "user", "content": "Say yes."}], "stream": False, "max_tokens": 1}


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            await reader.readexactly(length)
            writer.write(RESPONSE)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


async def measure(calls: int) -> dict:
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    client = UpstreamClient(url)
    plain = httpx.AsyncClient(base_url=url, trust_env=False, timeout=httpx.Timeout(None, connect=10.0))
    pool = httpcore.AsyncConnectionPool()
    session = aiohttp.ClientSession()
    encoded = json.dumps(BODY).encode()

    async def with_httpx() -> None:
        (await plain.post("/v1/chat/completions", json=BODY)).json()

    async def with_httpcore() -> None:
        response = await pool.request("POST", url + "/v1/chat/completions", content=encoded,
                                      headers={"content-type": "application/json"})
        json.loads(response.content)

    async def with_upstream() -> None:
        (await client.post("/v1/chat/completions", json=BODY)).json()

    async def with_aiohttp() -> None:
        async with session.post(url + "/v1/chat/completions", json=BODY) as response:
            json.loads(await response.read())

    clients = {"httpx": with_httpx, "httpcore": with_httpcore, "aiohttp": with_aiohttp, "upstream": with_upstream}
    cpu_us: dict[str, list[float]] = {name: [] for name in clients}
    for _ in range(2):  # two rounds in turn, so a drift of the machine shows
        for name, call in clients.items():
            for _ in range(200):
                await call()
            began = time.process_time()
            for _ in range(calls):
                await call()
            cpu_us[name].append(round((time.process_time() - began) / calls * 1e6, 1))
    await client.aclose()
    await plain.aclose()
    await pool.aclose()
    await session.close()
    server.close()
    return {"calls": calls, "cpu_us_per_call": cpu_us}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.calls)), indent=2))


if __name__ == "__main__":
    main()
