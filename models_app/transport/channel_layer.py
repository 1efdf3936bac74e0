"""The channel layers: one for the embedded default, one for the split over Redis.

``InMemoryChannelLayer`` copies each message by packing it with msgpack, as the Redis
layer serializes it, instead of Channels' ``deepcopy``: a third of the cost, and the
embedded default then carries exactly what the split can (a message Redis could not
carry fails in both modes alike).

``RedisChannelLayer`` is channels-redis with a one-round-trip send.  channels-redis
sends a message with four commands in a row (drop expired messages, count, add, set
the expiry), four round trips to Redis on the path of every request and every reply.
One Lua script does the same four steps atomically in one round trip; everything else
(receive, groups, the message format) is channels-redis's own.
"""
from __future__ import annotations

import asyncio
import time

import msgpack
from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer as _InMemoryChannelLayer
from channels_redis.core import RedisChannelLayer as _RedisChannelLayer


class InMemoryChannelLayer(_InMemoryChannelLayer):
    async def send(self, channel, message):
        """Send a message onto a channel, as a msgpack copy; ChannelFull at capacity."""
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_channel_name(channel)
        assert "__asgi_channel__" not in message
        queue = self.channels.setdefault(channel, asyncio.Queue(maxsize=self.get_capacity(channel)))
        try:
            queue.put_nowait((time.time() + self.expiry, msgpack.unpackb(msgpack.packb(message))))
        except asyncio.QueueFull:
            raise ChannelFull(channel) from None


# KEYS[1]: the channel's key; ARGV: oldest score kept, capacity, score, message, expiry (s).
SEND_SCRIPT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[1])
if redis.call('ZCOUNT', KEYS[1], '-inf', '+inf') >= tonumber(ARGV[2]) then
    return 0
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""


class RedisChannelLayer(_RedisChannelLayer):
    async def send(self, channel, message):
        """Send a message onto a (general or specific) channel; ChannelFull at capacity."""
        assert isinstance(message, dict), "message is not a dict"
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        assert "__asgi_channel__" not in message
        channel_non_local_name = channel
        if "!" in channel:
            message = dict(message.items())
            message["__asgi_channel__"] = channel
            channel_non_local_name = self.non_local_name(channel)
        channel_key = self.prefix + channel_non_local_name
        # Specific channels always go to the same server, general ones round-robin: as channels-redis.
        index = self.consistent_hash(channel) if "!" in channel else next(self._send_index_generator)
        connection = self.connection(index)
        now = time.time()
        sent = await connection.eval(
            SEND_SCRIPT, 1, channel_key,
            int(now) - int(self.expiry), self.get_capacity(channel), now, self.serialize(message), int(self.expiry),
        )
        if not sent:
            raise ChannelFull()
