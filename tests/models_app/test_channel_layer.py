"""The channel layers (models_app.transport.channel_layer): the embedded layer copies messages as the Redis
layer serializes them; the split's layer, against a real Redis, keeps channels-redis's semantics
(capacity, expiry, process-local channels) with its one-round-trip send and receive."""
from __future__ import annotations

import asyncio
import os
import time
import uuid

import pytest
import redis as sync_redis
import redis.asyncio as redis
from channels.exceptions import ChannelFull

from models_app.transport.channel_layer import SEND_SCRIPT, InMemoryChannelLayer, RedisChannelLayer

REDIS_URL = os.environ.get("LLMPOOL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


async def test_in_memory_messages_are_copies_shaped_as_redis_carries_them():
    layer = InMemoryChannelLayer(capacity=2)
    message = {"type": "reply", "data": {"pair": (1, 2), "text": "hi", "raw": b"\x00"}}
    await layer.send("work", message)
    message["data"]["text"] = "changed after sending"
    assert await layer.receive("work") == {"type": "reply", "data": {"pair": [1, 2], "text": "hi", "raw": b"\x00"}}


async def test_in_memory_refuses_what_redis_could_not_carry():
    layer = InMemoryChannelLayer()
    with pytest.raises(TypeError):
        await layer.send("work", {"type": "reply", "data": {1, 2}})


async def test_in_memory_full_channel_raises_channel_full():
    layer = InMemoryChannelLayer(capacity=2)
    await layer.send("work", {"type": "job"})
    await layer.send("work", {"type": "job"})
    with pytest.raises(ChannelFull):
        await layer.send("work", {"type": "job"})


async def test_in_memory_drops_expired_messages_on_a_later_receive():
    layer = InMemoryChannelLayer(expiry=60)
    layer.expiry = -1  # every message is already expired when it is queued
    await layer.send("stale", {"type": "job"})
    layer.expiry = 60
    await layer.send("fresh", {"type": "job"})
    assert await layer.receive("fresh") == {"type": "job"}  # the clean-up runs (first receive)
    with pytest.raises(TimeoutError):
        await layer.receive_within("stale", 0.05)


async def test_in_memory_cleans_expired_messages_at_most_once_a_second(monkeypatch):
    """The walk over every channel runs on a receive at most every CLEAN_EVERY_SECONDS, not on each."""
    layer = InMemoryChannelLayer()
    walks = []
    original = layer._clean_expired
    monkeypatch.setattr(layer, "_clean_expired", lambda: walks.append(1) or original())
    for number in range(20):
        await layer.send("work", {"type": "job", "number": number})
        assert (await layer.receive("work"))["number"] == number
    assert len(walks) == 1
    layer._cleaned_at -= InMemoryChannelLayer.CLEAN_EVERY_SECONDS
    await layer.send("work", {"type": "job"})
    await layer.receive("work")
    assert len(walks) == 2


async def test_in_memory_receive_within_times_out_and_a_cancelled_wait_loses_nothing():
    layer = InMemoryChannelLayer()
    channel = await layer.new_channel()
    assert channel.startswith("specific..inmemory!") and len(channel.rpartition("!")[2]) == 12
    with pytest.raises(TimeoutError):
        await layer.receive_within(channel, 0.02)
    waiting = asyncio.create_task(layer.receive_within(channel, 5))
    await asyncio.sleep(0.01)
    waiting.cancel()
    await layer.send(channel, {"type": "reply", "n": 1})  # sent as the wait is cancelled
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await layer.receive_within(channel, 1) == {"type": "reply", "n": 1}
    assert channel not in layer.channels  # an emptied channel is dropped


async def test_in_memory_still_refuses_an_invalid_channel_name():
    layer = InMemoryChannelLayer()
    with pytest.raises(TypeError):
        await layer.send("not a valid name!!", {"type": "job"})


@pytest.fixture
async def layer():
    prefix = f"llmpooltest-{uuid.uuid4().hex[:8]}"
    layer = RedisChannelLayer(hosts=[REDIS_URL], prefix=prefix, expiry=30, capacity=3,
                              channel_capacity={"roomy": 5})
    client = redis.from_url(REDIS_URL)
    try:
        yield layer, client, prefix
    finally:
        await layer.flush()
        await client.aclose()
        await layer.close_pools()


async def test_messages_arrive_in_order_on_a_general_channel(layer):
    layer, _, _ = layer
    for number in range(3):
        await layer.send("work", {"type": "job", "number": number})
    assert [(await layer.receive("work"))["number"] for _ in range(3)] == [0, 1, 2]


async def test_a_process_local_channel_gets_its_message(layer):
    layer, _, _ = layer
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "reply", "text": "hi"})
    assert await layer.receive(channel) == {"type": "reply", "text": "hi"}


async def test_a_full_channel_raises_channel_full_and_keeps_what_it_holds(layer):
    layer, client, prefix = layer
    for number in range(3):
        await layer.send("work", {"type": "job", "number": number})
    with pytest.raises(ChannelFull):
        await layer.send("work", {"type": "job", "number": 3})
    assert await client.zcard(f"{prefix}work") == 3
    for number in range(5):  # a per-channel capacity applies too
        await layer.send("roomy", {"type": "job", "number": number})
    with pytest.raises(ChannelFull):
        await layer.send("roomy", {"type": "job", "number": 5})


async def test_the_channel_key_expires_and_expired_messages_are_dropped(layer):
    layer, client, prefix = layer
    key = f"{prefix}work"
    await client.zadd(key, {b"stale": time.time() - 60})  # older than the 30 s expiry
    await layer.send("work", {"type": "job", "number": 1})
    assert 0 < await client.ttl(key) <= 30
    assert await client.zcard(key) == 1
    assert (await layer.receive("work"))["number"] == 1


# ---- the receive: one script when a message waits; the backup key as channels-redis keeps it ----


async def test_a_waiting_message_is_taken_without_the_blocking_pop(layer, monkeypatch):
    layer, _, _ = layer
    pops = []
    blocking_pop = redis.Redis.bzpopmin

    async def counted(self, *args, **kwargs):
        pops.append(args)
        return await blocking_pop(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "bzpopmin", counted)
    for number in range(3):
        await layer.send("work", {"type": "job", "number": number})
    assert [(await layer.receive("work"))["number"] for _ in range(3)] == [0, 1, 2]
    assert pops == []  # one script each, no BZPOPMIN round trip


async def test_a_message_left_in_the_backup_is_delivered_by_the_next_receive(layer):
    layer, client, prefix = layer
    # What a receive cancelled after its pop leaves behind: the message in the backup key only.
    message = layer.serialize({"type": "job", "number": 7})
    await client.zadd(layer._backup_channel_name(f"{prefix}work"), {message: 1.0})
    assert (await layer.receive("work"))["number"] == 7
    await asyncio.sleep(0.05)  # the receive's clean-up of the backup runs after it
    assert await client.zcard(layer._backup_channel_name(f"{prefix}work")) == 0


async def test_a_message_taken_by_the_blocking_pop_leaves_the_backup_empty(layer):
    layer, client, prefix = layer
    waiting = asyncio.create_task(layer.receive("work"))
    await asyncio.sleep(0.2)  # the receive waits in BZPOPMIN on the empty channel
    await layer.send("work", {"type": "job", "number": 1})
    assert (await asyncio.wait_for(waiting, 5))["number"] == 1
    await asyncio.sleep(0.05)
    assert await client.zcard(layer._backup_channel_name(f"{prefix}work")) == 0


async def test_a_receive_cancelled_while_its_pop_brings_another_channels_message_loses_nothing(layer):
    """One process's reply channels share one Redis list, and its receivers take turns popping it.
    The receiver whose client left is cancelled just as its pop takes a message meant for another
    channel of the process: that message must still reach the other channel's receiver (it was
    lost, and that request answered 503 after its reply timeout)."""
    layer, _, _ = layer
    leaving, staying = await layer.new_channel(), await layer.new_channel()
    popping = asyncio.create_task(layer.receive(leaving))
    await asyncio.sleep(0.2)  # it holds the receive lock and waits in BZPOPMIN
    # The other request's reply goes in while this loop does nothing else (a synchronous client),
    # so the pop's answer is in the socket, unread, when the cancel comes.
    message = {"type": "reply", "text": "for the request that stays", "__asgi_channel__": staying}
    with sync_redis.Redis.from_url(REDIS_URL) as client:
        now = time.time()
        client.eval(SEND_SCRIPT, 1, layer.prefix + layer.non_local_name(staying), int(now) - 30, 100, now,
                    layer.serialize(message), 30)
    time.sleep(0.1)
    popping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await popping
    received = await asyncio.wait_for(layer.receive(staying), 3)
    assert received == {"type": "reply", "text": "for the request that stays"}
