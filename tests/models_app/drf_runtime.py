"""The runtime behind Django's own test client, for the DRF views of the inference endpoints: the
embedded runtime host started over ``models`` (each loaded) and a Channels worker serving its
channel, as ``manage.py serve`` runs them."""
from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from pathlib import Path

from channels.layers import get_channel_layer
from channels.routing import ChannelNameRouter
from channels.worker import Worker

from models_app.conf import service_settings
from models_app.host import runtime_host
from models_app.host.consumer import RuntimeConsumer
from models_app.transport.messages import OP_LOAD, RUNTIME_CHANNEL


@asynccontextmanager
async def serving_runtime(folder: Path, settings, models: dict):
    """``settings`` is pytest-django's fixture; ``models`` the settings file's models."""
    path = folder / "settings.json"
    path.write_text(json.dumps({"models": models}))
    settings.LLMPOOL_SETTINGS = str(path)
    service_settings.cache_clear()
    service = await runtime_host.ensure_runtime()
    worker = Worker(ChannelNameRouter({RUNTIME_CHANNEL: RuntimeConsumer.as_asgi()}), [RUNTIME_CHANNEL], get_channel_layer())
    serving = asyncio.create_task(worker.handle())
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
