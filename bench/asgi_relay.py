"""A minimal HTTP proxy on an ASGI server and an upstream client, with nothing in between.

``bench/proxy_overhead.py`` calls llama-server through it: what it adds is the floor that any
proxy built on that server and that client pays on this machine, before llm-pool's own work
(the channel layer, the runtime's scheduling, the Responses mapping) adds its share.

SERVER is ``uvicorn`` (uvloop and httptools, with llm-pool's own protocol class: a response's head
sent with its body, ``models_app.http.connections.HeadWithBody``, as ``manage.py serve`` runs it), ``daphne`` (Twisted)
or ``granian`` (its Rust HTTP server, one worker, asyncio in Python); CLIENT is ``httpx`` (httpx's
own pool, the managed engines' client) or ``upstream`` (``runtime.backends.shared.upstream``, the
aiohttp-based candidate).  Non-streamed POSTs only.
Run: python bench/asgi_relay.py SERVER CLIENT LISTEN_PORT TARGET_PORT  (prints "ready")
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

_client = None


def _make_client():
    # From the environment, so that granian's worker process (which imports this module) sees them.
    target, kind = os.environ["LLMPOOL_RELAY_TARGET"], os.environ["LLMPOOL_RELAY_CLIENT"]
    if kind == "httpx":
        import httpx

        return httpx.AsyncClient(base_url=target, timeout=httpx.Timeout(None, connect=10.0), trust_env=False,
                                 limits=httpx.Limits(max_connections=None, max_keepalive_connections=256,
                                                     keepalive_expiry=4.0))
    from runtime.backends.shared.upstream import UpstreamClient

    return UpstreamClient(target)


async def app(scope, receive, send) -> None:
    """Forward one POST body to the same path upstream and send back the answer (non-streamed)."""
    global _client
    if scope["type"] != "http":
        return
    if _client is None:
        _client = _make_client()
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    upstream = await _client.post(scope["path"], content=body, headers={"content-type": "application/json"})
    content = upstream.content
    await send({"type": "http.response.start", "status": upstream.status_code,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]})
    await send({"type": "http.response.body", "body": content})


def run_daphne(port: int) -> None:
    from daphne.endpoints import build_endpoint_description_strings
    from daphne.server import Server
    from twisted.internet import reactor

    reactor.callWhenRunning(lambda: print("ready", flush=True))
    Server(application=app, endpoints=build_endpoint_description_strings(host="127.0.0.1", port=port),
           signal_handlers=True, http_timeout=None, verbosity=0).run()


def run_uvicorn(port: int) -> None:
    import asyncio

    import uvicorn
    import uvloop

    from models_app.http.connections import bounded_httptools_protocol

    async def main() -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=port, loop="none", http=bounded_httptools_protocol(),
                                lifespan="off", access_log=False, log_level="warning")
        server = uvicorn.Server(config)
        serving = asyncio.ensure_future(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        print("ready", flush=True)
        await serving

    uvloop.run(main())


def run_granian(port: int) -> None:
    import socket
    import threading
    import time

    from granian import Granian

    def announce() -> None:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                print("ready", flush=True)
                return
            except OSError:
                time.sleep(0.05)

    threading.Thread(target=announce, daemon=True).start()
    Granian("bench.asgi_relay:app", address="127.0.0.1", port=port, interface="asgi", workers=1,
            runtime_threads=1, loop="uvloop", log_enabled=False, env_files=None).serve()


if __name__ == "__main__":
    server, os.environ["LLMPOOL_RELAY_CLIENT"], listen = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.environ["LLMPOOL_RELAY_TARGET"] = f"http://127.0.0.1:{sys.argv[4]}"
    {"daphne": run_daphne, "uvicorn": run_uvicorn, "granian": run_granian}[server](listen)
