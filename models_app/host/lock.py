"""One runtime per node: a Redis lock with a heartbeat and an expiry.

The owner renews the key every ``ttl/3``; a crashed owner stops renewing and
the key expires, so a new worker can start after at most ``ttl`` seconds.  A renewal that
finds the key gone (Redis restarted empty, or the key expired while this owner's loop or
Redis stalled and nobody else took it) takes it again: the lock is lost only when another
worker holds it.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid

from redis import asyncio as aioredis

from models_app.host.tasks import cancel_and_wait

logger = logging.getLogger("llmpool.runtime")

_RENEW = """
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
if not holder then
  redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 2
end
return 0
"""
RETAKEN = 2  # _RENEW's answer when the key was gone and this owner took it again
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class RuntimeAlreadyRunning(RuntimeError):
    pass


class RuntimeOwnerLock:
    def __init__(self, redis_url: str, prefix: str, node_id: str, ttl_seconds: float = 10.0):
        self.redis = aioredis.from_url(redis_url)
        self.key = f"{prefix}:runtime-owner:{node_id}"
        self.node_id = node_id
        self.ttl_ms = int(ttl_seconds * 1000)
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._heartbeat: asyncio.Task | None = None
        self.lost = asyncio.Event()

    async def acquire(self) -> None:
        if not await self.redis.set(self.key, self.token, nx=True, px=self.ttl_ms):
            holder = await self.redis.get(self.key)
            holder = holder.decode() if holder else "an expired owner"
            raise RuntimeAlreadyRunning(
                f"another runtime worker already owns node {self.node_id!r} (held by {holder}); "
                f"stop it first, or wait up to {self.ttl_ms / 1000:g} s after it crashed"
            )
        self._heartbeat = asyncio.create_task(self._renew_forever())

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_ms / 3000)
            try:
                renewed = await self.redis.eval(_RENEW, 1, self.key, self.token, self.ttl_ms)
            except Exception:  # Redis away for a moment: keep trying until the key would expire
                logger.exception("renewing the runtime owner lock failed")
                continue
            if renewed == RETAKEN:
                logger.warning("the runtime owner lock of node %s was gone (Redis restarted, or it expired "
                               "while this worker stalled); taken again", self.node_id)
            elif not renewed:
                holder = await self.redis.get(self.key)
                logger.critical("lost the runtime owner lock of node %s to %s", self.node_id,
                                holder.decode() if holder else "nobody")
                self.lost.set()
                return

    async def release(self) -> None:
        if self._heartbeat is not None:
            await cancel_and_wait([self._heartbeat])
        try:
            await self.redis.eval(_RELEASE, 1, self.key, self.token)
        finally:
            await self.redis.aclose()
