"""The engine process: hosts one replica's engine and answers the runtime's frames.

``python -m runtime.engine_process.child --fd N [--warm BACKEND]`` reads frames from
the Unix socket it inherited as fd N (see ``protocol``); with ``--warm`` (a spare) it
first imports that backend's engine library (``spec.warm_up``).  It builds the engine
with ``BACKENDS[backend].create_engine(...)``, exactly as the runtime would in its own
process, and runs it on this process's event loop: ``load`` once, any number of
``generate``, ``embed``, ``transcribe`` and ``rerank`` at a time (each cancellable), ``unload`` (then it exits 0).  It
exits as soon as the socket closes: the runtime is gone.  Django is never imported.

A native fault kills this process, not the runtime; ``faulthandler`` writes the
Python stack of a SIGSEGV or SIGABRT to the output the runtime keeps the tail of.
"""
from __future__ import annotations

import argparse
import asyncio
import faulthandler
import logging
import os
import socket
import sys
import traceback
from contextlib import aclosing, contextmanager
from functools import partial
from collections.abc import AsyncIterator, Callable
from typing import Any

from runtime.backends import BACKENDS
from runtime.backends.base import EngineUnavailable, Finished, TextDelta
from runtime.engine_process import protocol as p
from runtime.errors import TokenCountUnsupported
from runtime.gpu import process_gpu_memory_bytes
from runtime.inputs.request import GenerationRequest
from runtime.inputs.transcription import Transcribed, TranscriptionRequest, TranscriptSegment

logger = logging.getLogger("llmpool.engine_process")


def rss_bytes() -> int:
    """This process's resident set size (from /proc, no dependency)."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class EngineHost:
    """The engine of this process and its running generations; one handler per op."""

    def __init__(self, outbox: p.Outbox):
        self.outbox = outbox
        self.engine = None
        self.generations: dict[Any, asyncio.Task] = {}
        self.loading: asyncio.Task | None = None
        self.done = asyncio.Event()  # set once unloaded: the process exits
        self._tasks: set[asyncio.Task] = set()
        self._handlers = {
            # A stream's handler is its relay itself: a fault's stack in the output tail stays short.
            p.LOAD: self._on_load, p.GENERATE: partial(self._relay, self._generation, _generation_frame),
            p.EMBED: self._on_embed, p.COUNT: self._on_count, p.RERANK: self._on_rerank,
            p.TRANSCRIBE: partial(self._relay, self._transcription, _transcription_frame),
            p.CANCEL: self._on_cancel, p.STATS: self._on_stats, p.RECONFIGURE: self._on_reconfigure,
            p.SLEEP: self._on_sleep, p.WAKE: self._on_wake, p.UNLOAD: self._on_unload,
        }

    def dispatch(self, message: dict[str, Any]) -> None:
        """Handle one frame in a task of its own; a failing handler answers ``error``."""
        handler = self._handlers.get(message.get("op"))
        if handler is None:
            self.outbox.send(p.unknown_op(message))
            return
        task = asyncio.get_running_loop().create_task(self._guarded(handler, message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(self, handler, message: dict[str, Any]) -> None:
        try:
            await handler(message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("engine process: %s failed", message["op"])
            self.outbox.send(p.error_message(exc, reply_to=message["op"], id=message.get("id")))

    async def _on_load(self, message: dict[str, Any]) -> None:
        if self.engine is not None:
            raise RuntimeError("this engine process has already loaded an engine")
        context = {**message["context"], "on_engine_failure": self._engine_failed,
                   "on_load_progress": self._load_progress}
        spec = BACKENDS[message["backend"]]
        engine = spec.create_engine(message["model_name"], message["config"], message["replica_index"], context)
        self.engine = engine
        self.loading = asyncio.current_task()
        try:
            await engine.load()
        finally:
            self.loading = None
        # The runtime's parser reads tool calls in the formats the engine answers them in.
        formats = getattr(engine, "tool_call_formats", None)
        self.outbox.send({"op": p.LOADED, "tool_call_formats": formats() if formats is not None else None})

    def _load_progress(self, stage: str, fraction: float | None) -> None:
        self.outbox.send({"op": p.PROGRESS, "stage": stage, "fraction": fraction})

    def _engine_failed(self, text: str) -> None:
        self.outbox.send({"op": p.FAILED, "message": text})

    @contextmanager
    def _running(self, request_id: Any):
        """Register this task as ``request_id``'s (a cancel finds it there) while it runs; a
        generation and an embedding share the ids."""
        if self.engine is None:
            raise RuntimeError("no engine is loaded in this engine process")
        if request_id in self.generations:
            raise RuntimeError(f"request {request_id!r} is already running")
        self.generations[request_id] = asyncio.current_task()
        try:
            yield
        finally:
            del self.generations[request_id]

    def _generation(self, request: dict[str, Any]) -> AsyncIterator:
        return self.engine.generate(GenerationRequest.from_wire(request))

    def _transcription(self, request: dict[str, Any]) -> AsyncIterator:
        """The engine's ``transcribe`` (runtime.inference.transcription)."""
        return self.engine.transcribe(TranscriptionRequest.from_wire(request))

    async def _relay(self, events_of: Callable[[dict], AsyncIterator], frame_of: Callable[[Any, Any], dict | None],
                     message: dict[str, Any]) -> None:
        """Send the frame of each event ``events_of(message["request"])`` yields (``frame_of(id,
        event)``; None: no frame), cancellable by the runtime while it runs."""
        request_id = message["id"]
        with self._running(request_id):
            async with aclosing(events_of(message["request"])) as stream:
                async for event in stream:
                    frame = frame_of(request_id, event)
                    if frame is not None:
                        self.outbox.send(frame)

    async def _on_embed(self, message: dict[str, Any]) -> None:
        """The engine's ``embed``, cancellable like a generation."""
        embed_id = message["id"]
        with self._running(embed_id):
            vectors, prompt_tokens = await self.engine.embed(message["inputs"], dimensions=message.get("dimensions"))
            self.outbox.send({"op": p.EMBEDDED, "id": embed_id, "vectors": vectors, "prompt_tokens": prompt_tokens})

    async def _on_rerank(self, message: dict[str, Any]) -> None:
        """The engine's ``rerank``, cancellable like a generation."""
        rerank_id = message["id"]
        with self._running(rerank_id):
            scores, prompt_tokens = await self.engine.rerank(message["query"], message["documents"])
            self.outbox.send({"op": p.RERANKED, "id": rerank_id, "scores": scores, "prompt_tokens": prompt_tokens})

    async def _on_count(self, message: dict[str, Any]) -> None:
        """The engine's ``count_tokens`` (runtime.inference.token_count), cancellable like a generation."""
        count_id = message["id"]
        with self._running(count_id):
            count = getattr(self.engine, "count_tokens", None)
            if count is None:
                raise TokenCountUnsupported(f"the {type(self.engine).__name__} engine cannot count tokens")
            tokens = await count(GenerationRequest.from_wire(message["request"]))
            self.outbox.send({"op": p.COUNTED, "id": count_id, "input_tokens": tokens})

    async def _on_cancel(self, message: dict[str, Any]) -> None:
        task = self.generations.get(message["id"])
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self.outbox.send({"op": p.CANCELLED, "id": message["id"]})

    async def _on_stats(self, message: dict[str, Any]) -> None:
        gpu_bytes = await asyncio.to_thread(process_gpu_memory_bytes, os.getpid())
        self.outbox.send({"op": p.STATS, "rss_bytes": rss_bytes(), "gpu_memory_bytes": gpu_bytes})

    # ---- inference state (runtime.model.residency) ------------------------------------------
    async def _on_reconfigure(self, message: dict[str, Any]) -> None:
        await self._inference_state("reconfigure", p.RECONFIGURED, message["config"], message.get("overlap", False))

    async def _on_sleep(self, message: dict[str, Any]) -> None:
        await self._inference_state("sleep", p.SLEPT)

    async def _on_wake(self, message: dict[str, Any]) -> None:
        await self._inference_state("wake", p.WOKEN)

    async def _inference_state(self, method: str, answer: str, *args) -> None:
        operation = getattr(self.engine, method, None)
        if operation is None:
            raise RuntimeError(f"the engine in this engine process cannot {method}")
        await operation(*args)
        self.outbox.send({"op": answer})

    async def _on_unload(self, message: dict[str, Any]) -> None:
        if self.loading is not None:  # the runtime gave up on the load (its load was cancelled)
            self.loading.cancel()
            await asyncio.gather(self.loading, return_exceptions=True)
        await self.cancel_generations()
        if self.engine is not None:
            await self.engine.unload()
            self.engine = None
        self.outbox.send({"op": p.UNLOADED})
        self.done.set()

    async def cancel_generations(self) -> None:
        tasks = list(self.generations.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _generation_frame(request_id, event) -> dict | None:
    if isinstance(event, TextDelta):
        delta = {"op": p.DELTA, "id": request_id, "text": event.text, "tokens": event.tokens}
        if event.logprobs is not None:
            delta["logprobs"] = event.logprobs
        return delta
    if isinstance(event, Finished):
        return {"op": p.FINISHED, "id": request_id, "input_tokens": event.input_tokens,
                "output_tokens": event.output_tokens, "finish_reason": event.finish_reason,
                "cached_tokens": event.cached_tokens, "draft_tokens": event.draft_tokens,
                "accepted_tokens": event.accepted_tokens}
    return None


def _transcription_frame(request_id, event) -> dict | None:
    if isinstance(event, TranscriptSegment):
        return {"op": p.SEGMENT, "id": request_id, "segment": event.to_wire()}
    if isinstance(event, Transcribed):
        return {"op": p.TRANSCRIBED, "id": request_id, "language": event.language, "duration": event.duration}
    return None


async def serve(sock: socket.socket) -> None:
    """Answer frames until ``unload`` finished or the runtime closed the socket."""
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    outbox = p.Outbox(writer)
    host = EngineHost(outbox)
    reading = asyncio.get_running_loop().create_task(_read_frames(reader, host, outbox))
    unloaded = asyncio.get_running_loop().create_task(host.done.wait())
    await asyncio.wait([reading, unloaded], return_when=asyncio.FIRST_COMPLETED)
    if unloaded.done():
        await outbox.close()
    reading.cancel()
    unloaded.cancel()


async def _read_frames(reader: asyncio.StreamReader, host: EngineHost, outbox: p.Outbox) -> None:
    while True:
        try:
            message = await p.read_frame(reader)
        except p.UndecodableFrame as exc:
            outbox.send(p.error_message(exc, reply_to="?"))
            continue
        if message is None:
            return
        host.dispatch(message)


def warm_up(backend: str) -> None:
    """Import ``backend``'s engine library; one that is missing fails the load later, as it would anyway."""
    try:
        BACKENDS[backend].warm_up()
    except EngineUnavailable as exc:
        logger.info("engine process: nothing to warm up for %s: %s", backend, exc)
    else:
        logger.info("engine process: %s warmed up", backend)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True, help="the inherited Unix socket to the runtime")
    parser.add_argument("--warm", choices=sorted(BACKENDS), help="import this backend's engine library first")
    args = parser.parse_args(argv)
    faulthandler.enable()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    if args.warm:
        warm_up(args.warm)
    sock = socket.socket(fileno=args.fd)
    code = 0
    try:
        asyncio.run(serve(sock))
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # Native engines may crash in their destructors at interpreter exit; the memory goes back
        # to the system with the process either way.
        os._exit(code)


if __name__ == "__main__":
    main()
