"""What the in-process engines share: threaded streams (runtime.backends.shared.in_process)."""
from __future__ import annotations

import asyncio
import threading
import time
from contextlib import aclosing

import pytest

from runtime.backends.shared.in_process import StepDelivery, stream_from_thread


async def test_a_threaded_stream_delivers_items_then_ends():
    def produce(emit, stop):
        for item in range(3):
            emit(item)

    assert [item async for item in stream_from_thread(produce)] == [0, 1, 2]


async def test_a_threaded_stream_raises_what_the_producer_raised():
    def produce(emit, stop):
        emit("first")
        raise RuntimeError("device lost")

    seen = []
    with pytest.raises(RuntimeError, match="device lost"):
        async for item in stream_from_thread(produce):
            seen.append(item)
    assert seen == ["first"]


async def test_leaving_a_threaded_stream_stops_the_producer_and_waits_for_it():
    finished = threading.Event()

    def produce(emit, stop):
        while not stop.is_set():
            emit("tick")
            time.sleep(0.01)
        finished.set()

    async with aclosing(stream_from_thread(produce)) as stream:
        async for _ in stream:
            break
    assert finished.is_set()  # closed means the thread has returned


def counting_wake_ups(loop: asyncio.AbstractEventLoop) -> list[int]:
    """Count ``loop.call_soon_threadsafe`` calls (each one wakes the loop) in the list returned."""
    calls = [0]
    original = loop.call_soon_threadsafe

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    loop.call_soon_threadsafe = counted
    return calls


def on_a_thread(work) -> None:
    """Run ``work`` on a thread of its own and wait for it (a worker's step, the loop blocked meanwhile)."""
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()


async def test_a_step_delivery_hands_a_steps_items_to_the_loop_at_once_in_their_order():
    loop = asyncio.get_running_loop()
    wake_ups = counting_wake_ups(loop)
    delivery = StepDelivery()
    first, second = asyncio.Queue(), asyncio.Queue()
    emit_first = delivery.emitter(loop, first, lambda: None)
    emit_second = delivery.emitter(loop, second, lambda: None)

    def step() -> None:
        for token in ("a", "b"):
            emit_first(token)
            emit_second(token.upper())
        delivery.flush()

    on_a_thread(delivery.flush)  # nothing collected: no wake-up
    assert wake_ups[0] == 0
    on_a_thread(step)
    assert wake_ups[0] == 1  # four items of two streams, one wake-up
    assert [await first.get(), await first.get(), await second.get(), await second.get()] == ["a", "b", "A", "B"]


async def test_a_step_delivery_items_wait_for_the_flush():
    loop = asyncio.get_running_loop()
    delivery = StepDelivery()
    items = asyncio.Queue()
    emit = delivery.emitter(loop, items, lambda: None)
    on_a_thread(lambda: emit("token"))
    await asyncio.sleep(0.01)
    assert items.empty()
    on_a_thread(delivery.flush)
    assert await asyncio.wait_for(items.get(), 1) == "token"


def test_a_step_delivery_to_a_closed_loop_tells_each_of_its_streams_they_are_lost():
    loop = asyncio.new_event_loop()
    lost = []
    delivery = StepDelivery()
    for name in ("first", "second"):
        delivery.emitter(loop, asyncio.Queue(), lambda name=name: lost.append(name))(name)
    loop.close()
    delivery.flush()
    assert lost == ["first", "second"]
    delivery.flush()  # handed over once: nothing left
    assert lost == ["first", "second"]
