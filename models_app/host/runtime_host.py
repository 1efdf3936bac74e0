"""The process-wide runtime instance, started once by ``serve`` or by the first message."""
from __future__ import annotations

import asyncio
import logging

from channels.layers import get_channel_layer
from django.conf import settings

from models_app.conf import service_settings
from models_app.host import catalog_mirror
from models_app.host.announcer import announce_here
from models_app.host.event_publisher import RuntimeEventPublisher
from models_app.transport import nodes
from runtime.service import RuntimeService

logger = logging.getLogger("llmpool.runtime")

_service: RuntimeService | None = None
_publisher: RuntimeEventPublisher | None = None
_lock: asyncio.Lock | None = None

def channel_layer():
    return get_channel_layer()


def reply_timeout() -> float:
    return service_settings().runtime_reply_timeout_seconds


def heartbeat_interval() -> float:
    return max(0.05, reply_timeout() / 4)


def event_entry(service: RuntimeService):
    """How the event publisher reads a model's entry: the one the admin API answers, ``node``
    included (``models_app.placement`` adds it there)."""
    name = nodes.this_node()
    return lambda controller: {**service.entry(controller), "node": name}


async def ensure_runtime(*, load_enabled: bool = True) -> RuntimeService:
    """Start the runtime once per process: read settings, mirror the catalog, load enabled models."""
    global _service, _publisher, _lock
    if _service is not None:
        return _service
    if _lock is None:
        _lock = asyncio.Lock()
    async with _lock:
        if _service is None:
            publisher = RuntimeEventPublisher(channel_layer())
            # Split: this node serves the models whose ``node`` includes it (its announcer tells the
            # API); embedded: every model, told to this process's registry.
            node = nodes.this_node() if nodes.is_split() else None
            announce = [] if nodes.is_split() else [announce_here]
            service = RuntimeService(
                settings.LLMPOOL_SETTINGS, listeners=[publisher.on_transition],
                reload_listeners=[*announce, catalog_mirror.sync], node=node,
            )
            publisher.attach(service.pool, event_entry(service))
            publisher.start()
            try:
                await service.start(load_enabled=load_enabled)
            except BaseException:
                await publisher.stop()
                raise
            _service, _publisher = service, publisher
            for listener in announce:
                await listener(service)
            await catalog_mirror.sync(service)
            logger.info("runtime started with %d configured models", len(service.pool.controllers))
    return _service


async def shutdown_runtime() -> None:
    global _service, _publisher
    if _service is not None:
        service, _service = _service, None
        nodes.REGISTRY.announce_here(None)
        await service.shutdown()
    if _publisher is not None:
        publisher, _publisher = _publisher, None
        await publisher.stop()
