"""The API's only way to reach the runtime: request/reply messages over the channel layer.

Every exchange gets its own reply channel.  The runtime acknowledges at once
and sends a heartbeat while it works, so a silent runtime is detected within
``service.runtime_reply_timeout_seconds`` and answered as 503
``runtime_unavailable``; streamed chunks arrive as messages on the same channel.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer

from models_app.conf import service_settings
from models_app.transport.messages import (
    REPLY_ACK,
    REPLY_ERROR,
    REPLY_HEARTBEAT,
    REPLY_RESULT,
    RUNTIME_CANCEL,
    RUNTIME_CHANNEL,
    RUNTIME_REQUEST,
)
from runtime.errors import RuntimeUnavailable, error_from_dict


class RuntimeClient:
    def __init__(self, reply_timeout: float | None = None):
        self.layer = get_channel_layer()
        self.reply_timeout = reply_timeout or service_settings().runtime_reply_timeout_seconds

    async def call(self, op: str, payload: dict | None = None, *, deadline: float | None = None) -> dict:
        """One request, one result (heartbeats keep it alive up to ``deadline`` seconds)."""
        exchange = self.exchange(op, payload or {}, deadline=deadline)
        try:
            async for message in exchange:
                if message["kind"] == REPLY_RESULT:
                    return message["data"]
        finally:
            await exchange.aclose()
        raise RuntimeUnavailable("the runtime closed the exchange without a result")

    async def exchange(
        self, op: str, payload: dict, *, deadline: float | None = None
    ) -> AsyncIterator[dict]:
        """Yield the runtime's chunk and result messages; raise its errors.

        Closing the iterator early (client gone) tells the runtime to cancel.
        """
        request_id = payload.get("request_id") or uuid.uuid4().hex
        # The layer's default prefix, as Channels consumers use: over Redis one process's receivers
        # take turns on one list per prefix, so a second prefix would starve behind a WebSocket's wait.
        reply_channel = await self.layer.new_channel()
        message = {
            "type": RUNTIME_REQUEST,
            "op": op,
            "payload": payload,
            "request_id": request_id,
            "reply_channel": reply_channel,
            # A runtime that (re)starts later drops what the API has already given up on.
            "expires_at": time.time() + self.reply_timeout,
        }
        try:
            await self.layer.send(RUNTIME_CHANNEL, message)
        except ChannelFull as exc:
            raise RuntimeUnavailable("the runtime's request queue is full") from exc
        give_up_at = time.monotonic() + deadline if deadline else None
        finished = False
        try:
            while True:
                reply = await self._receive(reply_channel, give_up_at)
                kind = reply["kind"]
                if kind in (REPLY_ACK, REPLY_HEARTBEAT):
                    continue
                if kind == REPLY_ERROR:
                    finished = True
                    raise error_from_dict(reply["data"])
                if kind == REPLY_RESULT:
                    finished = True
                yield reply
                if finished:
                    return
        finally:
            if not finished:
                await self._cancel(request_id)

    async def _receive(self, channel: str, give_up_at: float | None) -> dict:
        """The next message on ``channel``, or RuntimeUnavailable once the timeout passes.

        The layer's receive runs in a task of its own, waited on with ``asyncio.wait``; a cancel of
        the caller always raises here and cancels that task without waiting for it.  Neither
        simpler form is safe on Python 3.11:

        - ``asyncio.wait_for`` returns a message that arrived together with the cancel and drops
          the cancel, so a client that went away just as a heartbeat came kept its slot until the
          generation ended;
        - ``asyncio.timeout`` throws the cancel down into channels-redis's blocking pop, where it
          was seen to be lost until the pop returned, up to 5 s.
        """
        timeout = self.reply_timeout
        if give_up_at is not None:
            timeout = min(timeout, max(0.0, give_up_at - time.monotonic()))
        receiving = asyncio.ensure_future(self.layer.receive(channel))
        try:
            done, _ = await asyncio.wait((receiving,), timeout=timeout)
        finally:
            if not receiving.done():
                receiving.cancel()
        if not done:  # the timeout passed first
            if give_up_at is not None and time.monotonic() >= give_up_at:
                raise RuntimeUnavailable("the runtime did not finish within the call's time limit")
            raise RuntimeUnavailable(f"the runtime did not answer within {self.reply_timeout:g} s")
        return receiving.result()

    async def _cancel(self, request_id: str) -> None:
        cancel = {"type": RUNTIME_CANCEL, "request_id": request_id}
        try:
            await self.layer.send(RUNTIME_CHANNEL, cancel)
        except ChannelFull:
            pass
