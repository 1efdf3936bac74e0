"""RuntimeClient's receive never drops its caller's cancel (Python 3.11's wait_for does, when a
message arrives in the same step), and still times out as runtime_unavailable."""
from __future__ import annotations

import asyncio

import pytest

from models_app.transport.messages import REPLY_CHUNK, REPLY_HEARTBEAT, REPLY_RESULT, RUNTIME_CANCEL
from models_app.transport.runtime_client import RuntimeClient
from runtime.errors import RuntimeUnavailable


class OneMessageLayer:
    """A channel layer whose next message is whatever the test puts in ``arrived``."""

    def __init__(self):
        self.arrived = asyncio.get_running_loop().create_future()

    async def receive(self, channel):
        return await self.arrived


@pytest.fixture
def client():
    return RuntimeClient(reply_timeout=5)


async def test_a_cancel_that_comes_with_a_message_still_cancels(client):
    client.layer = OneMessageLayer()
    waiting = asyncio.create_task(client._receive("reply", None))
    await asyncio.sleep(0)  # the receive is under way
    client.layer.arrived.set_result({"kind": REPLY_HEARTBEAT})  # a heartbeat lands ...
    waiting.cancel()  # ... in the same step as the client's disconnect
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_a_message_is_returned(client):
    client.layer = OneMessageLayer()
    waiting = asyncio.create_task(client._receive("reply", None))
    await asyncio.sleep(0)
    client.layer.arrived.set_result({"kind": REPLY_RESULT, "data": 1})
    assert await waiting == {"kind": REPLY_RESULT, "data": 1}


async def test_silence_is_runtime_unavailable_and_the_receive_is_cancelled():
    client = RuntimeClient(reply_timeout=0.05)
    client.layer = OneMessageLayer()
    with pytest.raises(RuntimeUnavailable, match="did not answer within 0.05 s"):
        await client._receive("reply", None)
    await asyncio.sleep(0)
    assert client.layer.arrived.cancelled()


# ---- a reply the channel layer lost -------------------------------------------------------------


class ScriptedLayer:
    """A channel layer that answers the request with ``replies`` in order, then nothing."""

    def __init__(self, replies: list[dict]):
        self.replies = list(replies)
        self.sent: list[dict] = []

    async def new_channel(self):
        return "reply!1"

    async def send(self, channel, message):
        self.sent.append(message)

    async def receive(self, channel):
        if self.replies:
            return self.replies.pop(0)
        await asyncio.Event().wait()


def chunk(seq: int) -> dict:
    return {"kind": REPLY_CHUNK, "seq": seq, "data": {"delta": f"t{seq}"}}


async def received(layer: ScriptedLayer) -> list[dict]:
    """What a generate exchange over ``layer`` yields to its caller."""
    client = RuntimeClient(reply_timeout=5)
    client.layer = layer
    return [message async for message in client.exchange("runtime", "generate", {"model": "m"})]


async def test_chunks_in_order_and_their_count_on_the_result_pass():
    replies = [chunk(0), chunk(1), {"kind": REPLY_RESULT, "chunks": 2, "data": {}}]
    assert await received(ScriptedLayer(replies)) == replies


async def test_a_chunk_missing_in_the_middle_fails_the_request_and_cancels_it():
    layer = ScriptedLayer([chunk(0), chunk(2), {"kind": REPLY_RESULT, "chunks": 3, "data": {}}])
    with pytest.raises(RuntimeUnavailable, match="lost on the way"):
        await received(layer)
    assert layer.sent[-1]["type"] == RUNTIME_CANCEL  # the runtime stops generating for nobody


async def test_a_last_chunk_missing_fails_the_request_at_the_result():
    with pytest.raises(RuntimeUnavailable, match="lost on the way"):
        await received(ScriptedLayer([chunk(0), {"kind": REPLY_RESULT, "chunks": 2, "data": {}}]))


async def test_a_chunk_delivered_twice_is_passed_on_once():
    replies = [chunk(0), chunk(0), chunk(1), {"kind": REPLY_RESULT, "chunks": 2, "data": {}}]
    assert [m.get("seq") for m in await received(ScriptedLayer(replies))] == [0, 1, None]


async def test_the_runtime_numbers_its_chunks_and_counts_them_on_the_result(monkeypatch):
    from models_app.host import consumer, runtime_host

    class Service:
        async def handle(self, op, payload, emit):
            for n in range(3):
                await emit({"delta": n})
            return {"done": True}

    layer = ScriptedLayer([])

    async def ensure_runtime():
        return Service()

    monkeypatch.setattr(runtime_host, "channel_layer", lambda: layer)
    monkeypatch.setattr(runtime_host, "ensure_runtime", ensure_runtime)
    await consumer._serve({"reply_channel": "reply!1", "request_id": "r1", "op": "generate", "payload": {}})
    assert [(m["kind"], m.get("seq"), m.get("chunks")) for m in layer.sent] == [
        (REPLY_CHUNK, 0, None), (REPLY_CHUNK, 1, None), (REPLY_CHUNK, 2, None), (REPLY_RESULT, None, 3)]


async def read_two_and_leave(layer: ScriptedLayer) -> list[dict]:
    """A generate exchange whose caller leaves after two chunks; what ``on_cancelled`` got."""
    client = RuntimeClient(reply_timeout=0.2)
    client.layer, client.cancel_answer_seconds = layer, 0.2
    charged: list[dict] = []
    exchange = client.exchange("runtime", "generate", {"model": "m"}, on_cancelled=charged.append)
    assert [await anext(exchange), await anext(exchange)] == [chunk(0), chunk(1)]
    await exchange.aclose()
    return charged


async def test_a_cancel_is_charged_what_the_runtime_answers_it_with():
    cancelled = {"kind": REPLY_CHUNK, "seq": 2, "data": {"event": "cancelled", "usage": {"input_tokens": 9,
                                                                                        "output_tokens": 2}}}
    assert await read_two_and_leave(ScriptedLayer([chunk(0), chunk(1), cancelled])) == [
        {"input_tokens": 9, "output_tokens": 2}]


async def test_a_cancel_the_runtime_does_not_answer_in_time_is_charged_the_chunks_relayed():
    assert await read_two_and_leave(ScriptedLayer([chunk(0), chunk(1)])) == [{"output_tokens": 2}]


async def test_the_runtimes_count_is_waited_for_past_one_reply_timeout():
    class LateLayer(ScriptedLayer):
        """Its last message arrives 0.3 s after the rest: past the 0.2 s reply timeout."""

        async def receive(self, channel):
            if self.replies:
                return self.replies.pop(0)
            self.ready_at = self.ready_at or asyncio.get_running_loop().time() + 0.3
            await asyncio.sleep(max(0.0, self.ready_at - asyncio.get_running_loop().time()))
            return {"kind": REPLY_CHUNK, "seq": 2, "data": {"event": "cancelled", "usage": {"output_tokens": 1}}}

    layer = LateLayer([chunk(0), chunk(1)])
    layer.ready_at = None
    client = RuntimeClient(reply_timeout=0.2)
    client.layer, client.cancel_answer_seconds = layer, 2.0
    charged: list[dict] = []
    exchange = client.exchange("runtime", "generate", {"model": "m"}, on_cancelled=charged.append)
    await anext(exchange), await anext(exchange)
    await exchange.aclose()
    assert charged == [{"output_tokens": 1}]


def cancelled_chunk(seq: int, output_tokens: int) -> dict:
    return {"kind": REPLY_CHUNK, "seq": seq, "data": {"event": "cancelled", "usage": {"output_tokens": output_tokens}}}


class PopFinishingLayer(ScriptedLayer):
    """channels-redis's receive of a reply channel: a cancel that comes while it is blocked in Redis's
    pop is seen only once the pop returns, and the receive then returns that message all the same
    (seen in the split: the runtime's answer to the client's leaving, taken by the cut-off receive)."""

    def __init__(self, replies: list[dict]):
        super().__init__(replies)
        self.cancel_sent = asyncio.Event()
        self.blocked = False

    async def send(self, channel, message):
        await super().send(channel, message)
        if message["type"] == RUNTIME_CANCEL:
            self.cancel_sent.set()

    async def receive(self, channel):
        if self.replies:
            return self.replies.pop(0)
        if self.blocked:  # a later receive: the answer is gone already
            await asyncio.Event().wait()
        self.blocked = True
        try:
            await asyncio.Event().wait()  # blocked in the pop when the client leaves
        except asyncio.CancelledError:
            await self.cancel_sent.wait()
            return cancelled_chunk(2, 2)


async def test_the_answer_a_cut_off_receive_returns_all_the_same_is_the_charge():
    """The client leaves while the exchange waits for its third chunk: the receive it cut off returns
    the runtime's answer to the cancel, which is what is charged (not the edge's own count)."""
    client = RuntimeClient(reply_timeout=5)
    client.layer, client.cancel_answer_seconds = PopFinishingLayer([chunk(0), chunk(1)]), 2.0
    charged: list[dict] = []
    exchange = client.exchange("runtime", "generate", {"model": "m"}, on_cancelled=charged.append)

    async def read_all():
        async for _ in exchange:
            pass

    reading = asyncio.create_task(read_all())
    while not client.layer.blocked:
        await asyncio.sleep(0.01)
    reading.cancel()  # the client goes away
    with pytest.raises(asyncio.CancelledError):
        await reading
    assert charged == [{"output_tokens": 2}]
    assert client._cut_off == {}  # nothing kept once the exchange ended


async def test_a_cancel_not_answered_is_charged_the_output_chunks_not_the_events():
    """The runtime's own chunks (runtime.inference.pipeline): every one names its event."""
    sent = [{"event": "admitted"}, {"event": "delta", "text": "a"}, {"event": "reasoning", "text": "b"},
            {"event": "tool_call", "index": 0, "call": {}}, {"event": "upstream", "chunk": {}}]
    client = RuntimeClient(reply_timeout=0.2)
    client.layer = ScriptedLayer([{"kind": REPLY_CHUNK, "seq": n, "data": data} for n, data in enumerate(sent)])
    client.cancel_answer_seconds = 0.2
    charged: list[dict] = []
    exchange = client.exchange("runtime", "generate", {"model": "m"}, on_cancelled=charged.append)
    for _ in sent:
        await anext(exchange)
    await exchange.aclose()
    assert charged == [{"output_tokens": 4}]
