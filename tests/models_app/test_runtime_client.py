"""RuntimeClient's receive never drops its caller's cancel (Python 3.11's wait_for does, when a
message arrives in the same step), and still times out as runtime_unavailable."""
from __future__ import annotations

import asyncio

import pytest

from models_app.transport.messages import REPLY_HEARTBEAT, REPLY_RESULT
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
