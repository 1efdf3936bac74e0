"""What the in-process engines (ct2, vllm, exllamav3) share: their spec's library side and their
token streams.

- ``LibrarySpec``: the spec of a backend whose engine is a Python library loaded where the engine
  runs: its engine built from (config, context), its warm-up an import of the library, its
  VRAM estimate the model artifact's size.

- ``stream_from_thread``: run a blocking token producer in a worker thread and
  consume its items on the event loop; closing the stream stops the producer and
  waits for its thread, so an engine never runs two jobs at once behind the
  scheduler's back.
- ``generate_in_thread``: ``stream_from_thread`` for an engine's ``generate``.
- ``StepDelivery``: what a worker thread emits for several streams during one step of its
  work, handed to their event loop at once at the end of the step.

Their prompt helpers (chat-template messages, the thinking switch, tokenizer
templates) are in ``runtime.backends.shared.prompts``.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any, ClassVar

from runtime.backends.base import BackendSpec
from runtime.backends.shared.common_fields import artifact_estimate
from runtime.errors import BackendError, LLMPoolError


class LibrarySpec(BackendSpec):
    """A backend whose engine is a Python library (the module docstring), declared by its class:
    ``class Ct2Spec(LibrarySpec, engine=Ct2Engine, library=import_ctranslate2)``."""

    engine_class: ClassVar[type]  # built as engine_class(config, context)
    import_library: ClassVar[Callable[[], Any]]  # imports the library, or raises

    def __init_subclass__(cls, *, engine: type | None = None, library: Callable[[], Any] | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if engine is not None:  # a subclass of a backend's spec keeps its engine and library
            cls.engine_class = engine
        if library is not None:
            cls.import_library = staticmethod(library)

    def create_engine(self, model_name, config, replica_index, context):
        return self.engine_class(config, context)

    def warm_up(self) -> None:
        self.import_library()

    def vram_estimate(self, definition, config, replicas, base_dir):
        return artifact_estimate(base_dir, replicas, definition.model_path)

DONE = object()  # the last item a thread puts on a stream's queue


class Failure:
    """A thread's error on a stream's queue: the consumer raises it."""

    def __init__(self, error: BaseException):
        self.error = error


Produce = Callable[[Callable[[object], None], threading.Event], None]


async def stream_from_thread(produce: Produce, name: str = "engine-stream") -> AsyncIterator:
    """Yield what ``produce(emit, stop)`` emits from a thread of its own.

    ``produce`` runs the blocking engine loop, calls ``emit(item)`` for every item
    and returns when done; it must check ``stop.is_set()`` between steps and end
    early when it is set.  An exception it raises is raised here.  When the
    consumer stops early (cancelled, closed) ``stop`` is set and the thread is
    waited for before this generator finishes; iterate it under
    ``contextlib.aclosing`` so that happens as soon as the consumer leaves, not
    when the garbage collector finds the generator.  A thread per stream (not
    the default executor) keeps long generations from starving ``asyncio.to_thread``.
    """
    loop = asyncio.get_running_loop()
    items: asyncio.Queue = asyncio.Queue()
    finished = loop.create_future()
    stop = threading.Event()

    def emit(item) -> None:
        loop.call_soon_threadsafe(items.put_nowait, item)

    def run() -> None:
        try:
            produce(emit, stop)
        except BaseException as exc:  # delivered to the consumer, which raises it
            emit(Failure(exc))
        else:
            emit(DONE)
        finally:
            loop.call_soon_threadsafe(finished.set_result, None)

    threading.Thread(target=run, name=name, daemon=True).start()
    try:
        async for item in drain(items):
            yield item
    finally:
        stop.set()
        await asyncio.shield(finished)


async def drain(items: asyncio.Queue) -> AsyncIterator:
    """Yield what a thread put on ``items`` until it put ``DONE``; a ``Failure`` it put raises its error."""
    while True:
        item = await items.get()
        if item is DONE:
            return
        if isinstance(item, Failure):
            raise item.error
        yield item


async def generate_in_thread(produce: Produce, *, name: str, engine: str) -> AsyncIterator:
    """``stream_from_thread`` for an engine's ``generate``: the thread stops as soon as the
    consumer leaves, and a failure that is not already a request error becomes ``backend_error``
    naming the engine."""
    try:
        async with aclosing(stream_from_thread(produce, name=name)) as events:
            async for event in events:
                yield event
    except LLMPoolError:
        raise
    except Exception as exc:
        raise BackendError(f"{engine} generation failed: {exc}") from exc


class StepDelivery:
    """Items a worker thread emits for streams on event loops, handed over once per step.

    ``emitter(loop, queue, lost)`` gives one stream's emit, which only collects (on the worker
    thread); ``flush()``, which the worker calls when a step is over, puts everything collected
    on its queues with one ``call_soon_threadsafe`` per loop, in the order emitted.  A step that
    answers N streams then wakes their loop once, not N times: on a machine whose cores the
    engine's own threads keep busy, each wake-up takes time from them.  Where the loop is gone
    (nobody listens any more), ``lost`` of each of its streams is called instead.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, object, Callable[[], None]]]] = {}

    def emitter(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue,
                lost: Callable[[], None]) -> Callable[[object], None]:
        def emit(item) -> None:
            with self._lock:
                self._pending.setdefault(loop, []).append((queue, item, lost))

        return emit

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        for loop, items in pending.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the loop is closed
                for _, _, lost in items:
                    lost()


def _put_all(items: list[tuple[asyncio.Queue, object, Callable[[], None]]]) -> None:
    for queue, item, _ in items:
        queue.put_nowait(item)
