"""The API's only way to reach the runtime: request/reply messages over the channel layer.

Every exchange gets its own reply channel.  The runtime acknowledges at once
and sends a heartbeat while it works, so a silent runtime is detected within
``service.runtime_reply_timeout_seconds`` and answered as 503
``runtime_unavailable``; streamed chunks arrive as messages on the same channel.

A request that names a model (``model`` for inference, ``name`` for admin calls) goes to the node
that serves it (``models_app.transport.nodes.route``); a call about the whole pool goes to every
alive node and is merged (``models_app.transport.pool_calls``).  A client made for one ``channel``
talks to that node only.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from redis.exceptions import RedisError

from models_app.conf import service_settings
from models_app.transport import nodes, pool_calls, spread
from models_app.transport.messages import (
    OP_GENERATE,
    OP_EMBED,
    REPLY_ACK,
    REPLY_CHUNK,
    REPLY_ERROR,
    REPLY_HEARTBEAT,
    REPLY_RESULT,
    RUNTIME_CANCEL,
    RUNTIME_REQUEST,
)
from runtime.errors import RuntimeUnavailable, error_from_dict


TRACKED_OPS = (OP_GENERATE, OP_EMBED)
# A chunk missing from the runtime's replies: the channel layer lost it (Redis restarted while it
# held it).  The request fails as when the runtime is silent, never with a hole in its answer.
_LOST_REPLY = "a reply from the runtime was lost on the way (the channel layer restarted?)"


def model_of(op: str, payload: dict) -> str | None:
    """The model a request names: ``model`` for inference (and activity), ``name`` for admin calls."""
    if op in (OP_GENERATE, OP_EMBED):
        return payload.get("model")
    return payload.get("name") or payload.get("model")


class RuntimeClient:
    def __init__(self, reply_timeout: float | None = None, channel: str | None = None):
        self.layer = get_channel_layer()
        self.reply_timeout = reply_timeout or service_settings().runtime_reply_timeout_seconds
        self.channel = channel  # one node's channel; None: each request routed to its model's node

    def for_channel(self, channel: str) -> RuntimeClient:
        client = RuntimeClient(self.reply_timeout, channel)
        client.layer = self.layer
        return client

    async def call(self, op: str, payload: dict | None = None, *, deadline: float | None = None) -> dict:
        """One request, one result (heartbeats keep it alive up to ``deadline`` seconds).

        A pool call (``pool_calls.is_pool_call``) asks every alive node and answers the merge; a
        model's AdminModelEntry answered by its node says which (``node``)."""
        payload = payload or {}
        if self.channel is None and pool_calls.is_pool_call(op, payload):
            return await pool_calls.call_pool(self.for_channel, op, payload, deadline)
        if self.channel is None and op in spread.SPREAD_OPS:
            several = await spread.serving(model_of(op, payload))
            if len(several) > 1:  # replicas over several nodes (transport.spread)
                return await spread.call_spread(self.for_channel, op, payload, deadline, several)
        node = None
        if self.channel is None:
            node = await nodes.route(model_of(op, payload), payload.get("fairness_key"))
        result = await self._call(op, payload, deadline, node)
        if node is not None and isinstance(result, dict) and "runtime_state" in result and "name" in result:
            result = {**result, "node": node.name}
        return result

    async def _call(self, op: str, payload: dict, deadline: float | None, node: nodes.Node | None) -> dict:
        exchange = self.exchange(op, payload, deadline=deadline, node=node)
        try:
            async for message in exchange:
                if message["kind"] == REPLY_RESULT:
                    return message["data"]
        finally:
            await exchange.aclose()
        raise RuntimeUnavailable("the runtime closed the exchange without a result")

    async def exchange(
        self, op: str, payload: dict, *, deadline: float | None = None, node: nodes.Node | None = None
    ) -> AsyncIterator[dict]:
        """Yield the runtime's chunk and result messages; raise its errors.

        Closing the iterator early (client gone) tells the runtime to cancel.  ``node``: where
        ``call`` routed it already (else this client's channel, or routed here).
        """
        if node is None and self.channel is None:
            node = await nodes.route(model_of(op, payload), payload.get("fairness_key"))
        channel = node.channel if node is not None else self.channel
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
        # This process's requests in flight per node and model: routing's least-loaded pick.
        tracked = (nodes.track(node, model_of(op, payload), payload.get("fairness_key"))
                   if node is not None and op in TRACKED_OPS else None)
        try:
            await self.layer.send(channel, message)
        except ChannelFull as exc:
            nodes.untrack(tracked)
            raise RuntimeUnavailable("the runtime's request queue is full") from exc
        except (OSError, RedisError) as exc:  # Redis itself away: the same 503 as a silent runtime
            nodes.untrack(tracked)
            raise RuntimeUnavailable(f"the channel layer cannot be reached: {exc}") from exc
        give_up_at = time.monotonic() + deadline if deadline else None
        finished = False
        chunks = 0  # chunks received in order (their ``seq``: models_app.host.consumer)
        try:
            while True:
                try:
                    reply = await self._receive(reply_channel, give_up_at)
                except RuntimeUnavailable:
                    if node is not None:
                        nodes.suspect(node)  # silent: the next requests prefer another node meanwhile
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
                if kind == REPLY_RESULT:
                    if reply.get("chunks", chunks) != chunks:
                        raise RuntimeUnavailable(_LOST_REPLY)
                    finished = True
                yield reply
                if finished:
                    return
        finally:
            nodes.untrack(tracked)
            if not finished:
                await self._cancel(request_id, channel)

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

    async def _cancel(self, request_id: str, channel: str) -> None:
        cancel = {"type": RUNTIME_CANCEL, "request_id": request_id}
        try:
            await self.layer.send(channel, cancel)
        except (ChannelFull, OSError, RedisError):
            pass
