"""RuntimeEventPublisher.stop() returns even when the stop comes as a send completes.

CI once hung for 30 s on SIGTERM: the sender task had been cancelled, but Python 3.11's
asyncio.wait_for returned the finished send's result instead of raising, and the sender went
back to waiting on its outbox forever.  The sender now uses asyncio.timeout, which keeps the
cancel.
"""
from __future__ import annotations

import asyncio

from models_app.host.event_publisher import RuntimeEventPublisher
from models_app.host.tasks import cancel_and_wait


class _Layer:
    """A layer whose group_send finishes when the test says so."""

    def __init__(self):
        self.entered = asyncio.Event()
        self.release = asyncio.get_running_loop().create_future()
        self.sent = []

    async def group_send(self, group, message):
        self.entered.set()
        await self.release
        self.sent.append((group, message))


async def _sending() -> tuple[_Layer, RuntimeEventPublisher]:
    """A started publisher whose sender is inside the layer's group_send of one event."""
    layer = _Layer()
    publisher = RuntimeEventPublisher(layer, counter_interval=60)
    publisher.start()
    publisher._enqueue({"kind": "counters", "model": "m"})
    await asyncio.wait_for(layer.entered.wait(), 5)
    return layer, publisher


async def test_stop_returns_when_it_comes_as_a_send_completes():
    layer, publisher = await _sending()
    layer.release.set_result(None)
    await asyncio.sleep(0)  # the send's own task finishes; the sender has not woken yet
    assert layer.sent, "the send should have completed before the stop"
    await asyncio.wait_for(publisher.stop(), 5)
    assert publisher._tasks == []


async def test_stop_while_a_send_is_in_flight_cancels_it():
    layer, publisher = await _sending()
    await asyncio.wait_for(publisher.stop(), 5)
    assert layer.sent == []


class _SwallowingLayer:
    """A group_send that drops the first cancel it gets and returns, as a library call that
    completes just as the cancel comes may do (CI hung on SIGTERM so, under asyncio.timeout)."""

    def __init__(self):
        self.entered = asyncio.Event()
        self.swallowed = 0

    async def group_send(self, group, message):
        self.entered.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.swallowed += 1  # and returns as if the send had completed


async def test_stop_returns_when_a_send_drops_the_cancel():
    layer = _SwallowingLayer()
    publisher = RuntimeEventPublisher(layer, counter_interval=60)
    publisher.start()
    publisher._enqueue({"kind": "counters", "model": "m"})
    await asyncio.wait_for(layer.entered.wait(), 5)
    tasks = list(publisher._tasks)
    async with asyncio.timeout(5):  # without the re-cancel the sender waits on its outbox forever
        await publisher.stop()
    assert layer.swallowed == 1 and all(task.done() for task in tasks)


async def test_cancel_and_wait_gives_up_on_a_task_that_never_ends(caplog):
    released = asyncio.get_running_loop().create_future()

    async def stubborn():
        while True:
            try:
                return await asyncio.shield(released)
            except asyncio.CancelledError:
                continue  # every cancel dropped

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    await cancel_and_wait([task], timeout=1.2)  # returns, with a warning, instead of hanging
    assert not task.done() and "stubborn" in caplog.text
    released.set_result(None)
    await task
