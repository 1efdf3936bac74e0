"""A minimal HTTP proxy on llm-pool's own stack: daphne in front, the managed engines' httpx
client (``managed.server_client``) behind, and nothing in between.

``bench/proxy_overhead.py`` calls llama-server through it: what it adds is the floor that
any proxy built on daphne and that client pays on this machine, before llm-pool's own work
(the channel layer, the runtime's scheduling, the Responses mapping) adds its share.
Run: python bench/daphne_relay.py LISTEN_PORT TARGET_PORT
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.backends.managed import server_client  # noqa: E402

TARGET = ""
_client = None


async def app(scope, receive, send) -> None:
    """Forward one POST body to the same path upstream and send back the answer (non-streamed)."""
    global _client
    if scope["type"] != "http":
        return
    if _client is None:
        _client = server_client(TARGET)
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    upstream = await _client.post(scope["path"], content=body, headers={"content-type": "application/json"})
    await send({"type": "http.response.start", "status": upstream.status_code,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(upstream.content)).encode())]})
    await send({"type": "http.response.body", "body": upstream.content})


def main(listen_port: int, target_port: int) -> None:
    global TARGET
    TARGET = f"http://127.0.0.1:{target_port}"
    from daphne.endpoints import build_endpoint_description_strings
    from daphne.server import Server
    from twisted.internet import reactor

    reactor.callWhenRunning(lambda: print("ready", flush=True))
    Server(application=app, endpoints=build_endpoint_description_strings(host="127.0.0.1", port=listen_port),
           signal_handlers=True, http_timeout=None, verbosity=0).run()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
