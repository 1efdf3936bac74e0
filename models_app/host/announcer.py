"""A runtime worker's entry in the pool's registry (``models_app.transport.nodes``): its record and
its heartbeat.

Every ``HEARTBEAT_SECONDS`` (and right after each settings reload) the worker writes what it serves
(its models with their aliases, state and load), its devices and budgets, and renews its alive key
(expiry ``EXPIRY_SECONDS``); a worker that stops deletes the alive key, a killed one stops renewing
it, so either way the API sees the node down within ``EXPIRY_SECONDS``.  The record itself stays
(a week) so the API answers 503 runtime_unavailable for a down node's models, not 404.

Embedded, the runtime's node is this process's own: ``announce_here`` hands the registry the
models and their aliases when the runtime starts and after each reload, which is all the API
reads of it (it resolves a request's model by them).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from redis import asyncio as aioredis

from models_app.host.tasks import cancel_and_wait
from models_app.transport.nodes import (
    EXPIRY_SECONDS,
    HEARTBEAT_SECONDS,
    RECORD_TTL_SECONDS,
    REDIS_TIMEOUT_SECONDS,
    REGISTRY,
    keys,
    node_channel,
)
from runtime.backends.shared.adapters import adapter_aliases
from runtime.observe.read_models import model_entry

logger = logging.getLogger("llmpool.runtime")


def node_record(node: str, service, started_at: float) -> dict:
    """What the registry says of ``node``: the models its runtime ``service`` serves, its devices."""
    models = []
    for controller in list(service.pool.controllers.values()):
        entry = model_entry(controller)
        models.append({
            "name": controller.name,
            "aliases": list(controller.entry.definition.aliases),
            "adapters": adapter_aliases(controller.entry.definition),
            "enabled": controller.entry.definition.enabled,
            "runtime_state": entry["runtime_state"],
            "load": entry["inflight_requests"] + entry["queue_depth"],
            "replicas": entry["loaded_replicas"],
        })
    devices = service.pool.memory.device_report() if service.pool.memory is not None else []
    return {"node": node, "channel": node_channel(node), "models": models, "devices": devices,
            "started_at": started_at, "at": time.time()}


async def announce_here(service) -> None:
    """Embedded: ``service``'s models and their aliases in this process's registry (also a reload
    listener, so the API resolves names by the reloaded catalog before the reload is answered)."""
    models = [{"name": c.name, "aliases": list(c.entry.definition.aliases),
               "adapters": adapter_aliases(c.entry.definition)} for c in service.pool.controllers.values()]
    REGISTRY.announce_here({"models": models})


class NodeAnnouncer:
    def __init__(self, redis_url: str, prefix: str, node: str, service):
        self.redis = aioredis.from_url(redis_url, socket_timeout=REDIS_TIMEOUT_SECONDS,
                                       socket_connect_timeout=REDIS_TIMEOUT_SECONDS)
        self.keys = keys(prefix)
        self.node = node
        self.service = service
        self.started_at = time.time()
        self._task: asyncio.Task | None = None

    async def announce(self) -> None:
        record = json.dumps(node_record(self.node, self.service, self.started_at))
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.keys["record"] + self.node, record, ex=RECORD_TTL_SECONDS)
            pipe.set(self.keys["alive"] + self.node, "1", px=int(EXPIRY_SECONDS * 1000))
            pipe.sadd(self.keys["names"], self.node)
            await pipe.execute()

    async def after_reload(self, service) -> None:
        """A reload listener: the new catalog is in the registry before the reload is answered."""
        try:
            await self.announce()
        except Exception:
            logger.warning("could not announce node %s after a reload", self.node, exc_info=True)

    async def start(self) -> None:
        await self.announce()
        self._task = asyncio.create_task(self._beat_forever(), name="node-announcer")

    async def _beat_forever(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            try:
                await self.announce()
            except Exception:  # Redis away for a moment: the next beat tries again
                logger.warning("announcing node %s failed", self.node, exc_info=True)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
        try:
            await self.redis.delete(self.keys["alive"] + self.node)
        except Exception:
            logger.warning("could not take node %s out of the registry", self.node, exc_info=True)
        finally:
            await self.redis.aclose()
