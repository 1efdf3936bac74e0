"""What the in-process engines share: threaded streams (runtime.backends.shared.in_process)."""
from __future__ import annotations

import threading
import time
from contextlib import aclosing

import pytest

from runtime.backends.shared.in_process import stream_from_thread


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
