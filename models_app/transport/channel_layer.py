"""The channel layers: one for the embedded default, one for the split over Redis.

``InMemoryChannelLayer`` copies each message by packing it with msgpack, as the Redis
layer serializes it, instead of Channels' ``deepcopy``: a third of the cost, and the
embedded default then carries exactly what the split can (a message Redis could not
carry fails in both modes alike).  It also keeps Channels' receive off the path of every
request: Channels walks every channel for expired messages on each receive and builds a new
queue on each send and receive to offer ``setdefault``; this layer walks at most once a second
and builds a queue only for a new channel, and offers ``receive_within`` (a receive with a
timeout in the caller's own task: ``RuntimeClient``).

``RedisChannelLayer`` is channels-redis with a one-round-trip send and receive.  channels-redis
sends a message with four commands in a row (drop expired messages, count, add, set
the expiry), four round trips to Redis on the path of every request and every reply.
One Lua script does the same four steps atomically in one round trip.  A receive takes a
waiting message the same way: channels-redis restores its backup key (messages popped by a
receive that was cancelled), pops with BZPOPMIN and copies the message into the backup, three
round trips in a row before the message is handed on; one script does the three atomically when
a message is waiting (which also closes the window where a cancel between the pop and the copy
would lose the message), and an empty channel waits in the blocking pop and hands the message on at
once.  A receive cancelled while it waits there (its client left) lets the pop finish and puts
back a message it brings, which may be another request's reply.  Everything else (groups, the
backup's clean-up after a receive, the message format) is channels-redis's own.

Its connection pool waits for a free connection (``POOL_*``): redis-py 8's default pool holds at
most 100 connections and raises "Too many connections" past them, and every send holds one while
it runs, so a burst of a few hundred requests to one API process answered 503 for some of them.

When Redis cannot be reached (restarted, or down), a send fails at once with
``ChannelLayerUnavailable`` (a 503 ``runtime_unavailable``), and a receive waits and tries again
(``RECEIVE_RETRY_*``) rather than raising: the runtime worker's channel loop outlives the outage,
and an API process waiting for a reply gives up after its own reply timeout, as for a silent
runtime.  Either process carries on by itself once Redis is back.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import random
import string
import time

import msgpack
import redis.asyncio
import redis.exceptions
from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer as _InMemoryChannelLayer
from channels_redis.core import RedisChannelLayer as _RedisChannelLayer

from runtime.errors import RuntimeUnavailable

logger = logging.getLogger("llmpool.transport")

# What redis-py raises when the server is gone or does not answer.
REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, ConnectionError)
RECEIVE_RETRY_FIRST_SECONDS = 0.05
RECEIVE_RETRY_MAX_SECONDS = 1.0
# Connections to one Redis per process, and how long a send waits for one of them to be free
# (then it fails as when Redis cannot be reached: 503 runtime_unavailable).
POOL_MAX_CONNECTIONS = 256
POOL_WAIT_SECONDS = 5.0


class ChannelLayerUnavailable(RuntimeUnavailable):
    """Redis, which carries every message between the API and the runtime, cannot be reached."""


class InMemoryChannelLayer(_InMemoryChannelLayer):
    """Channels' in-memory layer with a cheaper path for a request and its replies (see the module
    docstring): messages copied through msgpack; a channel's queue made only when the channel has
    none; expired messages dropped at most once a second (``CLEAN_EVERY_SECONDS``), not by a walk
    over every channel on every receive; and a receive that can wait with a timeout in the caller's
    own task (``receive_within``)."""

    CLEAN_EVERY_SECONDS = 1.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._cleaned_at = 0.0
        self._valid_names: set[str] = set()

    def _check_name(self, channel: str) -> None:
        """Channels' check of the name; a named channel (a node's runtime channel: few and fixed)
        is checked once, a process-local one (``!``, a reply channel) every time."""
        if channel not in self._valid_names:
            self.require_valid_channel_name(channel)
            if "!" not in channel:
                self._valid_names.add(channel)

    def _queue(self, channel: str) -> asyncio.Queue:
        queue = self.channels.get(channel)
        if queue is None:
            queue = self.channels[channel] = asyncio.Queue(maxsize=self.get_capacity(channel))
        return queue

    async def send(self, channel, message):
        """Send a message onto a channel, as a msgpack copy; ChannelFull at capacity."""
        assert isinstance(message, dict), "message is not a dict"
        self._check_name(channel)
        assert "__asgi_channel__" not in message
        try:
            self._queue(channel).put_nowait((time.time() + self.expiry, msgpack.unpackb(msgpack.packb(message))))
        except asyncio.QueueFull:
            raise ChannelFull(channel) from None

    async def receive(self, channel):
        """The first message that arrives on ``channel`` (Channels' receive, cheaper; see the class)."""
        self._check_name(channel)
        now = time.time()
        if now - self._cleaned_at >= self.CLEAN_EVERY_SECONDS:
            self._cleaned_at = now
            self._clean_expired()
        queue = self._queue(channel)
        try:
            _, message = await queue.get()
        finally:
            if queue.empty() and self.channels.get(channel) is queue:
                del self.channels[channel]
        return message

    async def receive_within(self, channel: str, timeout: float):
        """``receive`` with a timeout (TimeoutError), waited for in the caller's task: a cancel of the
        caller ends the wait at once and loses nothing (the message stays queued)."""
        async with asyncio.timeout(timeout):
            return await self.receive(channel)

    async def new_channel(self, prefix="specific."):
        """A new process-local channel name (Channels' form: ``<prefix>.inmemory!<12 letters>``)."""
        return f"{prefix}.inmemory!{''.join(random.choices(string.ascii_letters, k=12))}"


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


# channels-redis's receive clean-up (restore the backup), then a pop that is copied into the
# backup, in one step; false when the channel is empty.
RECEIVE_SCRIPT = """
local backed_up = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = #backed_up, 1, -2 do
    redis.call('ZADD', KEYS[1], backed_up[i], backed_up[i - 1])
end
redis.call('DEL', KEYS[2])
local popped = redis.call('ZPOPMIN', KEYS[1])
if popped[1] then
    redis.call('ZADD', KEYS[2], popped[2], popped[1])
    return popped[1]
end
return false
"""


class RedisChannelLayer(_RedisChannelLayer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._giving_back: set[asyncio.Future] = set()  # see ``_give_back``

    def create_pool(self, index):
        """A pool that waits for a free connection instead of refusing (see the module docstring);
        a host given by Sentinel keeps channels-redis's own pool."""
        host = dict(self.hosts[index])
        if "address" not in host:
            return super().create_pool(index)
        address = host.pop("address")
        host.setdefault("max_connections", POOL_MAX_CONNECTIONS)
        host.setdefault("timeout", POOL_WAIT_SECONDS)
        return redis.asyncio.BlockingConnectionPool.from_url(address, **host)

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
        try:
            sent = await connection.eval(
                SEND_SCRIPT, 1, channel_key,
                int(now) - int(self.expiry), self.get_capacity(channel), now, self.serialize(message),
                int(self.expiry),
            )
        except REDIS_DOWN as exc:
            raise ChannelLayerUnavailable(f"the channel layer (Redis) cannot be reached: {exc}") from exc
        if not sent:
            raise ChannelFull()

    async def _brpop_with_clean(self, index, channel, timeout):
        """channels-redis's, in one round trip when a message is waiting (the module docstring)."""
        backup = self._backup_channel_name(channel)
        connection = self.connection(index)
        member = await connection.eval(RECEIVE_SCRIPT, 2, channel, backup)
        if member is not None:
            return member
        # The pop runs in a task of its own.  A process's reply channels share one list, and its
        # receivers take turns popping it, so the pop may bring a message meant for another
        # channel.  If this receive is cancelled meanwhile (its client left), redis-py drops the
        # answer in flight, and with it that message.  So a cancel does not reach the pop: a message
        # it brings after the cancel goes back into the list (``_give_back``), with its score, for
        # whoever pops next.
        popping = asyncio.ensure_future(connection.bzpopmin(channel, timeout=timeout))
        try:
            result = await asyncio.shield(popping)
        except asyncio.CancelledError:
            popping.add_done_callback(functools.partial(self._give_back, index, channel))
            raise
        # Not copied into the backup, as channels-redis does next: that copy is one more round trip
        # before the message is handed on, and a cancel could only come during the copy itself,
        # which would lose the message or not; handed on at once, nothing can cancel it.  The backup
        # stays empty (the script above emptied it), so the clean-up after the receive pops nothing.
        return result[1] if result is not None else None

    def _give_back(self, index: int, channel: str, popping: asyncio.Future) -> None:
        """Put back what a cancelled receive's pop took (see ``_brpop_with_clean``)."""
        if popping.cancelled() or popping.exception() is not None or popping.result() is None:
            return
        _, member, score = popping.result()
        putting = asyncio.ensure_future(self.connection(index).zadd(channel, {member: score}))
        self._giving_back.add(putting)
        putting.add_done_callback(self._given_back)

    def _given_back(self, putting: asyncio.Future) -> None:
        self._giving_back.discard(putting)
        if not putting.cancelled() and putting.exception() is not None:
            logger.warning("a reply taken by a cancelled receive could not be put back: %s", putting.exception())

    async def receive(self, channel):
        """The next message on ``channel``; while Redis cannot be reached, wait and try again."""
        delay, since = RECEIVE_RETRY_FIRST_SECONDS, None
        while True:
            try:
                message = await super().receive(channel)
            except REDIS_DOWN as exc:
                if since is None:
                    since = time.monotonic()
                    logger.warning("the channel layer (Redis) cannot be reached (%s); receiving %s again "
                                   "until it is back", exc, channel)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECEIVE_RETRY_MAX_SECONDS)
                continue
            if since is not None:
                logger.info("the channel layer (Redis) is back after %.1f s", time.monotonic() - since)
            return message
