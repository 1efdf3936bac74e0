"""The API's only way to reach the runtime: request/reply messages over the channel layer.

Every exchange gets its own reply channel.  The runtime acknowledges at once
and sends a heartbeat while it works, so a silent runtime is detected within
``service.runtime_reply_timeout_seconds`` and answered as 503
``runtime_unavailable``; streamed chunks arrive as messages on the same channel.

A client sends one exchange to one channel (a node's: ``models_app.transport.nodes``); which node
serves a call, and the merge of several nodes' answers, are placement's (``models_app.placement``).
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable

from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from redis.exceptions import RedisError

from models_app.conf import service_settings
from models_app.transport.messages import (
    REPLY_ACK,
    REPLY_CHUNK,
    REPLY_ERROR,
    REPLY_HEARTBEAT,
    REPLY_RESULT,
    RUNTIME_CANCEL,
    RUNTIME_REQUEST,
)
from runtime.errors import RuntimeUnavailable, error_from_dict
from runtime.inputs.request import GENERATE_ADMITTED, GENERATE_CANCELLED, GENERATE_WAITING


# A chunk missing from the runtime's replies: the channel layer lost it (Redis restarted while it
# held it).  The request fails as when the runtime is silent, never with a hole in its answer.
_LOST_REPLY = "a reply from the runtime was lost on the way (the channel layer restarted?)"


async def result_of(exchange: AsyncIterator[dict]) -> dict:
    """The result that ends ``exchange`` (its chunks passed over), the exchange closed after it."""
    try:
        async for message in exchange:
            if message["kind"] == REPLY_RESULT:
                return message["data"]
    finally:
        await exchange.aclose()
    raise RuntimeUnavailable("the runtime closed the exchange without a result")


# A generate's chunks that carry no output: they count for no token in the edge's own count.
_NOT_OUTPUT = frozenset({GENERATE_ADMITTED, GENERATE_WAITING})
CANCEL_ANSWER_SECONDS = 10.0  # the longest wait for the runtime's count of a cancelled generate

class RuntimeClient:
    def __init__(self, reply_timeout: float | None = None):
        self.layer = get_channel_layer()
        self.reply_timeout = reply_timeout or service_settings().runtime_reply_timeout_seconds
        # How long the runtime's exact count of a cancelled generate is waited for (the client is
        # gone; only the key's concurrency slot waits): a loaded machine can take seconds.
        self.cancel_answer_seconds = max(self.reply_timeout, CANCEL_ANSWER_SECONDS)
        # A reply channel's receive that its caller's cancel cut off (``_receive``), until its
        # exchange ends: channels-redis can finish the blocking pop before the cancel reaches it,
        # and the task then returns the message all the same (the runtime's answer to the cancel).
        self._cut_off: dict[str, asyncio.Future] = {}

    async def call(self, channel: str, op: str, payload: dict | None = None, *, deadline: float | None = None,
                   on_silent: Callable[[], None] | None = None) -> dict:
        """One request to ``channel``, one result (heartbeats keep it alive up to ``deadline`` seconds)."""
        return await result_of(self.exchange(channel, op, payload or {}, deadline=deadline, on_silent=on_silent))

    async def exchange(self, channel: str, op: str, payload: dict, *, deadline: float | None = None,
                       on_silent: Callable[[], None] | None = None,
                       on_cancelled: Callable[[dict], None] | None = None) -> AsyncIterator[dict]:
        """Yield the runtime's chunk and result messages from ``channel``; raise its errors.

        Closing the iterator early (client gone) tells the runtime to cancel; with ``on_cancelled``,
        the runtime's answer to the cancel (a generate's ``cancelled`` chunk, or the result
        that crossed the cancel) is then waited for, up to the reply timeout, and its ``usage``
        handed to ``on_cancelled``.  ``on_silent`` is called when the runtime does not answer in
        time (or the layer cannot be reached), before the RuntimeUnavailable is raised.
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
            await self.layer.send(channel, message)
        except ChannelFull as exc:
            raise RuntimeUnavailable("the runtime's request queue is full") from exc
        except (OSError, RedisError) as exc:  # Redis itself away: the same 503 as a silent runtime
            raise RuntimeUnavailable(f"the channel layer cannot be reached: {exc}") from exc
        give_up_at = time.monotonic() + deadline if deadline else None
        finished = closed_early = False
        chunks = 0  # chunks received in order (their ``seq``: models_app.host.consumer)
        relayed = 0  # of them, those that carry output (a delta, reasoning, a tool call: not admitted, waiting)
        try:
            while True:
                try:
                    reply = await self._receive(reply_channel, give_up_at)
                except RuntimeUnavailable:
                    if on_silent is not None:
                        on_silent()
                    raise
                kind = reply["kind"]
                if kind in (REPLY_ACK, REPLY_HEARTBEAT):
                    continue
                if kind == REPLY_ERROR:
                    finished = True
                    raise error_from_dict(reply["data"])
                if kind == REPLY_CHUNK and "seq" in reply:
                    if reply["seq"] < chunks:
                        continue  # a send the layer delivered twice (its client retried it)
                    if reply["seq"] > chunks:
                        raise RuntimeUnavailable(_LOST_REPLY)
                    chunks += 1
                    relayed += (reply.get("data") or {}).get("event") not in _NOT_OUTPUT
                if kind == REPLY_RESULT:
                    if reply.get("chunks", chunks) != chunks:
                        raise RuntimeUnavailable(_LOST_REPLY)
                    finished = True
                try:
                    yield reply
                except GeneratorExit:
                    closed_early = True
                    raise
                if finished:
                    return
        except asyncio.CancelledError:
            closed_early = True
            raise
        finally:
            cut_off = self._cut_off.pop(reply_channel, None)
            if not finished:
                await self._cancel(request_id, channel)
                if closed_early and on_cancelled is not None:
                    await self._answer_to_cancel(reply_channel, on_cancelled, relayed, cut_off)

    async def _receive(self, channel: str, give_up_at: float | None) -> dict:
        """The next message on ``channel``, or RuntimeUnavailable once the timeout passes.

        The layer's receive runs in a task of its own, waited on with ``asyncio.wait``; a cancel of
        the caller always raises here and cancels that task without waiting for it.  Neither
        simpler form is safe on Python 3.11:

        - ``asyncio.wait_for`` returns a message that arrived together with the cancel and drops
          the cancel, so a client that goes away just as a heartbeat comes keeps its slot until the
          generation ends;
        - ``asyncio.timeout`` throws the cancel down into channels-redis's blocking pop, where it
          can be lost until the pop returns, up to 5 s.

        A layer with a ``receive_within`` (the embedded in-memory one, whose receive is a plain
        queue wait that a cancel ends at once, losing nothing) waits in this task instead: one task
        and two wake-ups fewer on every reply.
        """
        timeout = self.reply_timeout
        if give_up_at is not None:
            timeout = min(timeout, max(0.0, give_up_at - time.monotonic()))
        receive_within = getattr(self.layer, "receive_within", None)
        if receive_within is not None:  # a layer whose receive is safe to wait for here (the embedded one)
            try:
                return await receive_within(channel, timeout)
            except TimeoutError:
                self._timed_out(give_up_at)
        receiving = asyncio.ensure_future(self.layer.receive(channel))
        try:
            done, _ = await asyncio.wait((receiving,), timeout=timeout)
        except asyncio.CancelledError:
            self._cut_off[channel] = receiving  # the exchange's end looks there first
            raise
        finally:
            if not receiving.done():
                receiving.cancel()
        if not done:  # the timeout passed first
            self._timed_out(give_up_at)
        try:
            return receiving.result()
        except (OSError, RedisError) as exc:
            raise RuntimeUnavailable(f"the channel layer cannot be reached: {exc}") from exc

    def _timed_out(self, give_up_at: float | None):
        if give_up_at is not None and time.monotonic() >= give_up_at:
            raise RuntimeUnavailable("the runtime did not finish within the call's time limit")
        raise RuntimeUnavailable(f"the runtime did not answer within {self.reply_timeout:g} s")

    async def _answer_to_cancel(self, reply_channel: str, on_cancelled: Callable[[dict], None], relayed: int,
                                cut_off: asyncio.Future | None = None) -> None:
        """Wait (up to ``cancel_answer_seconds``) for what the runtime answers a cancel with, and hand its
        usage to ``on_cancelled``.  A runtime that says nothing in time, or fails, is charged what
        the edge saw, ``{"output_tokens": relayed}`` (the output chunks relayed, a token each at
        most), so that leaving early is never free (the caller adds its prompt estimate).

        One receive waits the whole time (a series of shorter ones would each risk what ``cut_off``
        shows), and the first is ``cut_off``: the exchange's receive that the client's leaving
        cancelled, which over Redis can still return the next message (this answer) instead of
        ending cancelled."""
        give_up_at = time.monotonic() + self.cancel_answer_seconds
        receiving = cut_off
        try:
            while (left := give_up_at - time.monotonic()) > 0:
                if receiving is None:
                    receiving = asyncio.ensure_future(self.layer.receive(reply_channel))
                done, _ = await asyncio.wait((receiving,), timeout=left)
                if not done:
                    break
                ended, receiving = receiving, None
                if ended.cancelled():
                    continue
                if ended.exception() is not None:  # a layer that cannot be reached answers at once
                    await asyncio.sleep(0.05)
                    continue
                reply = ended.result()
                kind, data = reply["kind"], reply.get("data") if isinstance(reply.get("data"), dict) else {}
                if kind == REPLY_ERROR:
                    break
                if kind == REPLY_RESULT or (kind == REPLY_CHUNK and data.get("event") == GENERATE_CANCELLED):
                    on_cancelled(data.get("usage") or {})
                    return
        finally:
            if receiving is not None and not receiving.done():
                receiving.cancel()
        on_cancelled({"output_tokens": relayed})

    async def _cancel(self, request_id: str, channel: str) -> None:
        cancel = {"type": RUNTIME_CANCEL, "request_id": request_id}
        try:
            await self.layer.send(channel, cancel)
        except (ChannelFull, OSError, RedisError):
            pass
