"""The service in this test's own process: the embedded runtime host started over ``models``
(each loaded) with its channel served (``consumer.serve_channel``), as ``manage.py serve`` runs
them, and an HTTP client of the ASGI application (``llmpool.asgi``) that a server would serve."""
from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from channels.layers import get_channel_layer

from models_app.conf import service_settings
from models_app.host import runtime_host
from models_app.host.consumer import serve_channel
from models_app.transport.messages import OP_LOAD, RUNTIME_CHANNEL


@asynccontextmanager
async def serving_runtime(folder: Path, settings, models: dict):
    """``settings`` is pytest-django's fixture; ``models`` the settings file's models."""
    path = folder / "settings.json"
    path.write_text(json.dumps({"models": models}))
    settings.LLMPOOL_SETTINGS = str(path)
    service_settings.cache_clear()
    service = await runtime_host.ensure_runtime()
    serving = asyncio.create_task(serve_channel(RUNTIME_CHANNEL, get_channel_layer()))
    try:
        for name in models:
            loaded = await service.handle(OP_LOAD, {"name": name, "body": {}}, None)
            assert loaded["runtime_state"] == "loaded"
        yield service
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        await runtime_host.shutdown_runtime()
        service_settings.cache_clear()


def asgi_client() -> httpx.AsyncClient:
    """A client of ``llmpool.asgi.application``, the whole HTTP router, without a server."""
    from llmpool.asgi import application

    return httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://127.0.0.1")
