"""A bare asyncio TCP relay, the floor of what any extra Python process on a request's path costs.

``bench/proxy_overhead.py`` runs it between the client and llama-server and calls the server
through it: the bytes pass unparsed, so the latency it adds is the price of one more process
(its wake-ups and two loopback hops), without HTTP or llm-pool.
Run: python bench/tcp_relay.py LISTEN_PORT TARGET_PORT
"""
from __future__ import annotations

import asyncio
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def main(listen_port: int, target_port: int) -> None:
    async def relay(client_reader, client_writer):
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pipe(client_reader, upstream_writer), pipe(upstream_reader, client_writer))

    server = await asyncio.start_server(relay, "127.0.0.1", listen_port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
