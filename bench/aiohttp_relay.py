"""The same minimal proxy as bench/daphne_relay.py, with aiohttp's HTTP server in front instead of daphne.

``bench/proxy_overhead.py`` calls llama-server through both: the difference between the two is
what daphne's HTTP handling costs a proxied request on this machine, the figure behind
replacing it (docs/performance.md).
Run: python bench/aiohttp_relay.py LISTEN_PORT TARGET_PORT
"""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.backends.managed import server_client  # noqa: E402


async def main(listen_port: int, target_port: int) -> None:
    client = server_client(f"http://127.0.0.1:{target_port}")

    async def forward(request: web.Request) -> web.Response:
        upstream = await client.post(request.path, content=await request.read(),
                                     headers={"content-type": "application/json"})
        return web.Response(status=upstream.status_code, body=upstream.content, content_type="application/json")

    app = web.Application()
    app.router.add_post("/{path:.*}", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", listen_port).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
