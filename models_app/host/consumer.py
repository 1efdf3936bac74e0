"""The runtime side of the channel layer: a thin adapter around ``runtime.service``.

Each request runs in its own task so one slow load never blocks another
message; each task isolates its exceptions and always answers (result or
error), acknowledging at once and sending heartbeats while it works.
"""
from __future__ import annotations

import asyncio
import logging
import time

from channels.consumer import AsyncConsumer, get_handler_name
from channels.exceptions import ChannelFull

from models_app.host import runtime_host
from models_app.transport.channel_layer import ChannelLayerUnavailable
from models_app.transport.messages import (
    OP_GENERATE,
    REPLY_ACK,
    REPLY_CHUNK,
    REPLY_ERROR,
    REPLY_HEARTBEAT,
    REPLY_RESULT,
    RUNTIME_REPLY,
)
from runtime.errors import LLMPoolError

logger = logging.getLogger("llmpool.consumer")

_running: dict[str, asyncio.Task] = {}


class RuntimeConsumer(AsyncConsumer):
    async def dispatch(self, message: dict) -> None:
        """Channels' dispatch closes stale database connections first, through a thread hop per
        message; the runtime's handlers touch no connection of this task (the catalog mirror
        writes through ``database_sync_to_async``, which manages its own), so call them directly."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def runtime_request(self, message: dict) -> None:
        if message.get("expires_at", float("inf")) < time.time():
            logger.warning("dropping expired request %s (%s)", message.get("request_id"), message.get("op"))
            return
        task = asyncio.create_task(_serve(message))
        _running[message["request_id"]] = task
        task.add_done_callback(lambda _t, rid=message["request_id"]: _running.pop(rid, None))

    async def runtime_cancel(self, message: dict) -> None:
        task = _running.get(message["request_id"])
        if task is not None:
            task.cancel()


async def serve_channel(channel: str, layer) -> None:
    """Serve the runtime's ``channel``: each message straight to ``RuntimeConsumer``'s handler.

    Channels' own worker hands every message through an application instance's queue and the
    consumer's ``await_many_dispatch`` (two more tasks and hops per message); the consumer's
    handlers only start a request's task or cancel one, so they are called here directly.  A
    message that fails to dispatch (no handler for its type) is logged and the channel served on."""
    consumer = RuntimeConsumer()
    while True:
        message = await layer.receive(channel)
        try:
            await consumer.dispatch(message)
        except Exception:
            logger.exception("runtime channel %s: message of type %r not handled", channel, message.get("type"))


async def _serve(message: dict) -> None:
    reply_channel, request_id, op = message["reply_channel"], message["request_id"], message["op"]
    layer = runtime_host.channel_layer()

    chunks_sent = 0

    async def send(kind: str, data=None) -> None:
        """Send one reply; a full reply channel (slow reader) is waited on, up to the reply timeout.
        A chunk carries its number (``seq``) and the result the number of chunks before it
        (``chunks``), so that the caller sees a chunk the layer lost (Redis restarted while it held
        it) instead of a stream with a hole in it (``RuntimeClient.exchange``)."""
        nonlocal chunks_sent
        message = {"type": RUNTIME_REPLY, "request_id": request_id, "kind": kind, "data": data}
        if kind == REPLY_CHUNK:
            message["seq"] = chunks_sent
            chunks_sent += 1
        elif kind == REPLY_RESULT:
            message["chunks"] = chunks_sent
        give_up_at = time.monotonic() + runtime_host.reply_timeout()
        delay = 0.005
        while True:
            try:
                await layer.send(reply_channel, message)
                return
            except ChannelFull:
                if time.monotonic() >= give_up_at:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.1)

    beat = _Heartbeat(send, runtime_host.heartbeat_interval())
    try:
        # A generate gets no ack: its heartbeat starts at once instead (one message fewer per request).
        if op != OP_GENERATE:
            await send(REPLY_ACK)
        service = await runtime_host.ensure_runtime()
        beat.start()
        payload = dict(message.get("payload") or {}, request_id=request_id)
        result = await service.handle(op, payload, lambda data: send(REPLY_CHUNK, data))
        await beat.stop()  # no heartbeat may follow the last message: nothing is left in the layer
        await send(REPLY_RESULT, result)
    except asyncio.CancelledError:
        logger.info("request %s (%s) cancelled by its caller", request_id, op)
    except ChannelLayerUnavailable as exc:  # Redis went away: the caller has its 503 (transport.channel_layer)
        logger.warning("request %s (%s) abandoned: %s", request_id, op, exc.message)
    except LLMPoolError as exc:
        await beat.stop()
        await _send_quietly(send, REPLY_ERROR, exc.to_dict())
    except ChannelFull:
        logger.warning("request %s (%s): reply channel full, caller is gone", request_id, op)
    except Exception:
        # The answer names the request id the log is searched by, never the exception's text.
        logger.exception("request %s (%s) failed", request_id, op)
        await beat.stop()
        await _send_quietly(send, REPLY_ERROR, LLMPoolError(f"internal error (request id {request_id})").to_dict())
    finally:
        beat.abandon()


class _Heartbeat:
    """Sends ``heartbeat`` every ``interval`` seconds until stopped.

    A timer, not a task: most requests end before their first beat, and a timer costs a
    fraction of a task (and of the extra task ``wait_for`` makes) per request.  It ends on a
    flag, and a beat being sent when the request ends is waited for, never cancelled: over the
    Redis layer a cancelled send can go on sending, so cancelling it hangs the request (its
    caller receives heartbeats but never the result).
    """

    def __init__(self, send, interval: float):
        self.send, self.interval = send, interval
        self.stopped = False
        self.timer: asyncio.TimerHandle | None = None
        self.sending: asyncio.Task | None = None

    def start(self) -> None:
        self.timer = asyncio.get_running_loop().call_later(self.interval, self._beat)

    def _beat(self) -> None:
        if not self.stopped:
            self.sending = asyncio.create_task(self._send_and_rearm())

    async def _send_and_rearm(self) -> None:
        await self.send(REPLY_HEARTBEAT)
        if not self.stopped:
            self.timer = asyncio.get_running_loop().call_later(self.interval, self._beat)

    async def stop(self) -> None:
        """Stop and wait for a heartbeat being sent right now (bounded by the send's own limit)."""
        self.stopped = True
        if self.timer is not None:
            self.timer.cancel()
        if self.sending is not None:
            await asyncio.gather(self.sending, return_exceptions=True)

    def abandon(self) -> None:
        self.stopped = True
        if self.timer is not None:
            self.timer.cancel()
        if self.sending is not None and not self.sending.done():
            self.sending.cancel()


async def _send_quietly(send, kind, data) -> None:
    try:
        await send(kind, data)
    except ChannelFull:
        logger.warning("could not deliver %s: reply channel full", kind)
    except ChannelLayerUnavailable as exc:
        logger.warning("could not deliver %s: %s", kind, exc.message)
