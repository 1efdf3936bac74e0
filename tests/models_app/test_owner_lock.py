"""The split's runtime owner lock (models_app/host/lock.py) against a real Redis: one owner per
node, a key that vanished (Redis restarted empty, or expired during a stall) taken again, and
the lock lost only to another owner."""
from __future__ import annotations

import asyncio
import uuid

import pytest
from redis import asyncio as aioredis

from models_app.host.lock import RuntimeAlreadyRunning, RuntimeOwnerLock
from tests.conftest import REDIS_URL

TTL = 0.3  # renewed every 0.1 s


@pytest.fixture
async def owner():
    prefix = f"llmpooltest-{uuid.uuid4().hex[:10]}"
    lock = RuntimeOwnerLock(REDIS_URL, prefix, "node-a", ttl_seconds=TTL)
    await lock.acquire()
    redis = aioredis.from_url(REDIS_URL)
    try:
        yield lock, redis, prefix
    finally:
        await lock.release()
        await redis.delete(lock.key)
        await redis.aclose()


async def test_a_second_worker_for_the_node_is_refused(owner):
    lock, _, prefix = owner
    other = RuntimeOwnerLock(REDIS_URL, prefix, "node-a", ttl_seconds=TTL)
    with pytest.raises(RuntimeAlreadyRunning, match="node-a"):
        await other.acquire()
    await other.redis.aclose()


async def test_a_vanished_key_is_taken_again_not_lost(owner):
    lock, redis, _ = owner
    await redis.delete(lock.key)  # what a Redis restarted without persistence looks like
    await asyncio.sleep(TTL)
    assert (await redis.get(lock.key)).decode() == lock.token
    assert not lock.lost.is_set()


async def test_the_lock_is_lost_to_another_owner(owner):
    lock, redis, _ = owner
    await redis.set(lock.key, "another-host:1:abcd")
    await asyncio.wait_for(lock.lost.wait(), timeout=5 * TTL)
    assert (await redis.get(lock.key)) == b"another-host:1:abcd"  # the other owner's key is left alone
