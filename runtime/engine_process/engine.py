"""``ProcessEngine``: the runtime's Engine for a replica hosted in an engine process.

``load`` takes the warm spare engine process of its backend (``spares``) or starts
``python -m runtime.engine_process.child`` through the supervisor (``launch``: own
process group, PR_SET_PDEATHSIG, a pidfile for the start-up sweep, its output in a
ring and ``<state_dir>/logs/<model>.r<replica>.log``) and sends ``load``.
``generate`` sends ``generate`` and yields the deltas (coalesced when the consumer
lags: their text joined, their tokens and logprobs entries added up) and the final
usage; ``embed`` (``rerank``) sends ``embed`` (``rerank``) and returns its vectors (scores);
``transcribe`` sends ``transcribe`` and yields its segments and its end; an ``error`` frame is raised as
the LLMPoolError its code names.

When the process dies (an exit, a signal, or its socket closing), every waiting
call fails at once with ``BackendError`` naming the signal or exit code and the
tail of its output: a load in progress fails with it, each active generate raises
it, and a loaded engine reports it to ``context["on_engine_failure"]``.
``unload`` sends ``unload``, waits for the exit, and kills the group after a grace
period (at once when the engine is stalled); it is safe after a failed load and twice.

A cancelled generate (or embed) waits ``CANCEL_WAIT_SECONDS`` for the child to confirm it has
stopped.  The child answers a cancel from its event loop at once (native work runs on worker
threads), so a cancel left unanswered means that loop is blocked (a template that never ends
rendering): the engine is ``stalled``.  ``kill`` ends such a process with SIGKILL, and its death
is then reported as any other, naming why it was killed.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import signal
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

from runtime.backends.base import Finished, GenerationRequest, TextDelta
from runtime.engine_process import protocol as p
from runtime.engine_process.launch import launch_engine_process
from runtime.engine_process.spares import SPARES
from runtime.inputs.transcription import Transcribed, TranscriptionRequest, TranscriptSegment
from runtime.pool.devices import cuda_visible_devices
from runtime.errors import BackendError, LLMPoolError
from runtime.model.load_progress import STAGE_ENGINE_PROCESS_STARTED
from runtime.model.load_progress import report as report_progress
from runtime.supervisor import ManagedProcess
from runtime.inference.tool_calls import format_for

logger = logging.getLogger("llmpool.runtime")

UNLOAD_GRACE_SECONDS = 30.0  # from ``unload`` to the process's exit, then SIGKILL
CANCEL_WAIT_SECONDS = 5.0  # a cancelled generate waits this long for the engine to stop (else: stalled)
EXIT_AFTER_EOF_SECONDS = 2.0  # the socket closed: the exit should follow within this


def describe_death(returncode: int | None) -> str:
    """``died of SIGSEGV``, ``exited with code 3``."""
    if returncode is None:
        return "closed its connection"
    if returncode < 0:
        try:
            return f"died of {signal.Signals(-returncode).name}"
        except ValueError:
            return f"died of signal {-returncode}"
    return f"exited with code {returncode}"


class _Stream:
    """What one generation received so far: frames, or the failure that ended it."""

    def __init__(self):
        self.items: deque[dict[str, Any] | LLMPoolError] = deque()
        self.ready = asyncio.Event()
        self.cancelled = asyncio.Event()  # the child answered ``cancel``

    def put(self, item: dict[str, Any] | LLMPoolError) -> None:
        self.items.append(item)
        self.ready.set()

    async def next_event(self) -> TextDelta | Finished:
        """The next event, with every delta already received joined into one."""
        while not self.items:
            self.ready.clear()
            await self.ready.wait()
        joined = None
        while self.items and isinstance(self.items[0], dict) and self.items[0]["op"] == p.DELTA:
            delta = self.items.popleft()
            if joined is None:
                joined = {"text": delta["text"], "tokens": delta.get("tokens", 1), "logprobs": delta.get("logprobs")}
            else:
                p.merge_deltas(joined, delta)
        if joined is not None:
            return TextDelta(joined["text"], joined["tokens"], joined["logprobs"])
        item = self.items.popleft()
        if isinstance(item, LLMPoolError):
            raise item
        if item["op"] == p.FINISHED:
            return Finished(item["input_tokens"], item["output_tokens"], item["finish_reason"], item.get("cached_tokens"),
                            item.get("draft_tokens"), item.get("accepted_tokens"))
        raise p.error_from_message(item)

    async def next_reply(self, op: str) -> dict[str, Any]:
        """The one answer of an embed, a rerank or a count: its ``op`` frame (an error frame or a failure raise)."""
        return await self.next_frame((op,))

    async def next_transcript(self) -> TranscriptSegment | Transcribed:
        """The next segment of a transcription, or its end."""
        frame = await self.next_frame((p.SEGMENT, p.TRANSCRIBED))
        if frame["op"] == p.TRANSCRIBED:
            return Transcribed(frame["language"], frame["duration"])
        return TranscriptSegment.from_wire(frame["segment"])

    async def next_frame(self, ops: tuple[str, ...]) -> dict[str, Any]:
        """The next frame, one of ``ops`` (an error frame or a failure raise)."""
        while not self.items:
            self.ready.clear()
            await self.ready.wait()
        item = self.items.popleft()
        if isinstance(item, LLMPoolError):
            raise item
        if item["op"] not in ops:
            raise p.error_from_message(item)
        return item


class ProcessEngine:
    """One replica of ``config["backend"]`` in an engine process of its own."""

    def __init__(self, model_name: str, config: dict[str, Any], replica_index: int, context: dict):
        self.model_name = model_name
        self.config = config
        self.replica_index = replica_index
        self.context = context
        self.label = f"engine process for model {model_name}, replica {replica_index + 1}"
        self.process: ManagedProcess | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task | None = None
        self._ids = itertools.count()
        self._streams: dict[int, _Stream] = {}
        self._replies: dict[str, asyncio.Future] = {}  # op -> the answer awaited
        self._control = asyncio.Lock()
        self._failure: BackendError | None = None
        self._death: asyncio.Task | None = None
        self._loaded = False
        self._stopping = False
        self._unanswered: set[int] = set()  # ids whose cancel the child left unanswered (``stalled``)
        self._killed: str | None = None  # why ``kill`` ended the process
        self._tool_call_formats: dict[str, str] | None = None  # the child's engine's, from ``loaded``

    # ---- lifecycle -------------------------------------------------------------------
    async def load(self) -> None:
        """Start the engine process and load the engine in it; raise what stopped it."""
        state_dir = Path(self.context["state_dir"])
        try:
            await self._start(state_dir)
            report_progress(self.context, STAGE_ENGINE_PROCESS_STARTED)
            loaded = await self._call(p.LOAD, {
                "backend": self.config["backend"],
                "model_name": self.model_name,
                "config": self.config,
                "replica_index": self.replica_index,
                "context": {
                    "base_dir": str(self.context["base_dir"]),
                    "model_name": self.context["model_name"],
                    "state_dir": str(self.context["state_dir"]),
                    "kv_store": self.context.get("kv_store"),
                },
            }, p.LOADED)
            self._tool_call_formats = loaded.get("tool_call_formats")
        except BaseException:
            await self.unload()
            raise
        finally:
            # The next spare starts once this load is done, so that its start-up does not slow it.
            SPARES.replenish(self.config["backend"], state_dir)
        self._loaded = True

    async def _start(self, state_dir: Path) -> None:
        log_path = state_dir / "logs" / f"{self.model_name}.r{self.replica_index}.log"
        # A spare was started without CUDA_VISIBLE_DEVICES and cannot take it later: spares serve
        # loads placed on cpu (or on no device); a load placed on GPUs starts a process of its own.
        visible = cuda_visible_devices(self.config.get("placement"))
        handle = None
        if visible is None:
            handle = await SPARES.take(self.config["backend"], state_dir, self.label, log_path)
        if handle is None:
            env = {"CUDA_VISIBLE_DEVICES": visible} if visible is not None else None
            handle = await launch_engine_process(self.label, log_path, state_dir, env_extra=env)
        self.process = handle.process
        self.process.on_exit(lambda process: self._lost())
        if not self.process.running:  # it died between the take and here
            self._lost()
        reader, self._writer = await asyncio.open_unix_connection(sock=handle.sock)
        self._reading = asyncio.get_running_loop().create_task(self._read(reader), name=f"read:{self.label}")

    async def unload(self) -> None:
        """Send ``unload``, wait for the exit (SIGKILL after the grace), then forget the process."""
        self._stopping = True
        if self.process is None:
            return
        # A stalled or killed process cannot answer ``unload``: it is stopped at once.
        if self.process.running and self._failure is None and self._killed is None and not self._unanswered:
            try:
                async with asyncio.timeout(UNLOAD_GRACE_SECONDS):
                    await self._call(p.UNLOAD, {}, p.UNLOADED)
            except (LLMPoolError, TimeoutError) as exc:
                # It is killed below; its memory goes back with the process either way.
                logger.warning("%s did not unload cleanly: %s", self.label, str(exc) or type(exc).__name__)
            await self.process.wait_exit(UNLOAD_GRACE_SECONDS)
        await self.process.stop(grace=0)
        if self._writer is not None:
            self._writer.close()
        if self._reading is not None:
            self._reading.cancel()
            await asyncio.gather(self._reading, return_exceptions=True)
        if self._death is not None:
            await asyncio.gather(self._death, return_exceptions=True)
        self.process = None
        self._loaded = False

    async def stats(self) -> dict[str, Any]:
        """``{"rss_bytes", "gpu_memory_bytes"}`` of the engine process (the second None where
        NVML cannot be read)."""
        reply = await self._call(p.STATS, {}, p.STATS)
        return {key: value for key, value in reply.items() if key != "op"}

    # ---- inference state (runtime.model.residency) ------------------------------------------
    async def reconfigure(self, config: dict[str, Any], overlap: bool = False) -> None:
        """Rebuild the child engine's inference state with ``config`` (its weights stay; ``overlap``:
        the new one built before the old is freed); an ``error`` answer (the old state serving on
        in the child) raises its LLMPoolError."""
        await self._call(p.RECONFIGURE, {"config": config, "overlap": overlap}, p.RECONFIGURED)
        self.config = config

    async def sleep(self) -> None:
        await self._call(p.SLEEP, {}, p.SLEPT)

    async def wake(self) -> None:
        await self._call(p.WAKE, {}, p.WOKEN)

    # ---- generation ------------------------------------------------------------------
    def tool_call_format(self, request: GenerationRequest) -> str | None:
        """The format the child's engine answers ``request``'s tool calls in (runtime.inference.tool_calls
        reads them here, in the runtime process), as it reported at load."""
        return format_for(self._tool_call_formats, request)

    def _open_stream(self) -> tuple[int, _Stream]:
        """A new request id and the stream its child's answers arrive on; raises if the engine
        failed or is not loaded."""
        if self._failure is not None:
            raise self._failure
        if not self._loaded:
            raise BackendError(f"{self.label} is not loaded")
        request_id = next(self._ids)
        stream = self._streams[request_id] = _Stream()
        return request_id, stream

    async def _close_stream(self, request_id: int, stream: _Stream, *, ended: bool) -> None:
        """Forget ``request_id``'s stream; one the child has not ended is cancelled there first."""
        if not ended and self._failure is None:
            await self._cancel_remote(request_id, stream)
        self._streams.pop(request_id, None)

    def generate(self, request: GenerationRequest) -> AsyncIterator[TextDelta | Finished]:
        return self._streamed({"op": p.GENERATE, "request": request.to_wire()}, _Stream.next_event, Finished)

    async def embed(self, inputs, *, dimensions: int | None = None) -> tuple[list[list[float]], int]:
        """Send ``embed`` and await its vectors; a cancelled call cancels it in the child too."""
        reply = await self._one_reply({"op": p.EMBED, "inputs": inputs, "dimensions": dimensions}, p.EMBEDDED)
        return reply["vectors"], reply["prompt_tokens"]

    async def rerank(self, query: str, documents: list[str]) -> tuple[list[float], int]:
        """Send ``rerank`` and await its scores; a cancelled call cancels it in the child too."""
        reply = await self._one_reply({"op": p.RERANK, "query": query, "documents": documents}, p.RERANKED)
        return reply["scores"], reply["prompt_tokens"]

    def transcribe(self, request: TranscriptionRequest) -> AsyncIterator[TranscriptSegment | Transcribed]:
        """Send ``transcribe`` and yield its segments, then its end; closing early cancels it in the child."""
        return self._streamed({"op": p.TRANSCRIBE, "request": request.to_wire()}, _Stream.next_transcript, Transcribed)

    async def _streamed(self, message: dict[str, Any], next_event: Callable[[_Stream], Awaitable[Any]],
                        last: type) -> AsyncIterator:
        """Send ``message`` on a stream of its own and yield what ``next_event`` reads from it, up to
        and with its ``last`` event; closing early cancels it in the child."""
        request_id, stream = self._open_stream()
        ended = False
        try:
            await self._send({"op": message["op"], "id": request_id, **message})
            while True:
                event = await next_event(stream)
                if isinstance(event, last):
                    ended = True
                    yield event
                    return
                yield event
        except LLMPoolError:
            ended = True  # the child ended it (or died)
            raise
        finally:
            await self._close_stream(request_id, stream, ended=ended)

    async def count_tokens(self, request: GenerationRequest) -> int:
        """Send ``count`` and await the child's engine's count of ``request``'s prompt tokens."""
        reply = await self._one_reply({"op": p.COUNT, "request": request.to_wire()}, p.COUNTED)
        return reply["input_tokens"]

    async def _one_reply(self, message: dict[str, Any], answer: str) -> dict[str, Any]:
        """Send ``message`` under a new id and await its one ``answer`` frame (a stream of one)."""
        async with aclosing(self._streamed(message, lambda stream: stream.next_reply(answer), dict)) as replies:
            return await anext(replies)

    async def _cancel_remote(self, generation_id: int, stream: _Stream) -> None:
        """Tell the child to stop ``generation_id`` and wait (briefly) until it has; unanswered, the
        engine is ``stalled`` until the answer comes."""
        try:
            await self._send({"op": p.CANCEL, "id": generation_id})
            async with asyncio.timeout(CANCEL_WAIT_SECONDS):
                await stream.cancelled.wait()
        except LLMPoolError:
            pass  # the process is gone; its death report deals with it
        except TimeoutError:
            if self._failure is None:
                self._unanswered.add(generation_id)
                logger.warning("%s did not stop within %g s of a cancel", self.label, CANCEL_WAIT_SECONDS)

    @property
    def stalled(self) -> bool:
        """Whether a cancel went unanswered for ``CANCEL_WAIT_SECONDS`` (and still is): the engine
        process's event loop is blocked, so it answers nothing else either."""
        return bool(self._unanswered) and self._failure is None

    def kill(self, reason: str) -> None:
        """SIGKILL the engine process now (it is ``stalled``); its death is reported as a crash is,
        with why (the unanswered cancel and ``reason``) in the message."""
        if self.process is not None and self.process.running and self._killed is None:
            self._killed = f"it did not stop within {CANCEL_WAIT_SECONDS:g} s of a cancel; {reason}"
            logger.warning("%s: killing it: %s", self.label, self._killed)
            self.process.kill()

    # ---- the socket ------------------------------------------------------------------
    async def _send(self, message: dict[str, Any]) -> None:
        if self._failure is None:
            try:
                self._writer.write(p.encode(message))
                await self._writer.drain()
                return
            except ConnectionError:
                self._lost()
                await asyncio.shield(self._death)
        raise self._failure

    async def _call(self, op: str, fields: dict[str, Any], answer: str) -> dict[str, Any]:
        """Send a control op and await its answer (or the failure that prevents one)."""
        async with self._control:
            reply = asyncio.get_running_loop().create_future()
            self._replies[answer] = self._replies[op] = reply
            try:
                await self._send({"op": op, **fields})
                return await reply
            finally:
                self._replies.pop(answer, None)
                self._replies.pop(op, None)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                message = await p.read_frame(reader)
            except p.UndecodableFrame:
                continue
            except p.ProtocolError:
                message = None
            if message is None:
                self._lost()
                return
            for one in p.unbatched(message):
                self._receive(one)

    def _receive(self, message: dict[str, Any]) -> None:
        op = message["op"]
        answers = (p.DELTA, p.FINISHED, p.EMBEDDED, p.RERANKED, p.COUNTED, p.SEGMENT, p.TRANSCRIBED, p.CANCELLED)
        if op in answers or (op == p.ERROR and message.get("id") is not None):
            if op == p.CANCELLED:
                self._unanswered.discard(message.get("id"))  # a late answer: it was not stuck after all
            stream = self._streams.get(message.get("id"))
            if stream is None:
                return  # a generation the runtime stopped waiting for
            if op == p.CANCELLED:
                stream.cancelled.set()
            else:
                stream.put(message)
        elif op == p.PROGRESS:
            if not self._loaded and isinstance(message.get("stage"), str):
                fraction = message.get("fraction")
                report_progress(self.context, message["stage"], fraction if isinstance(fraction, float) else None)
        elif op == p.FAILED:
            if self._loaded and not self._stopping:
                self.context["on_engine_failure"](f"{self.label}: {message.get('message')}")
        else:
            key = message.get("reply_to") if op == p.ERROR else op
            reply = self._replies.get(key)
            if reply is None or reply.done():
                return  # nothing awaits it (an error about an op nobody waits for)
            if op == p.ERROR:
                reply.set_exception(p.error_from_message(message))
            else:
                reply.set_result(message)

    # ---- death -----------------------------------------------------------------------
    def _lost(self) -> None:
        """The process exited or its socket closed: report once, after the exit is known."""
        if self._death is None:
            self._death = asyncio.get_running_loop().create_task(self._report_death())

    async def _report_death(self) -> None:
        process = self.process
        if not await process.wait_exit(EXIT_AFTER_EOF_SECONDS):
            await process.stop(grace=0)
        await process.output_settled()
        when = "while unloading" if self._stopping else "while loaded" if self._loaded else "while loading"
        why = f" (killed: {self._killed})" if self._killed is not None else ""
        death = f"{self.label} {describe_death(process.returncode)} {when}{why}"
        message = f"{death}; last output:\n{process.tail()}"
        serving = self._loaded and not self._stopping
        # Requests are told how it died; its output goes to last_error alone (an operator's
        # detail: paths, stacks).  A load or an unload it ends fails with the output.
        self._failure = BackendError(death if serving else message)
        for reply in self._replies.values():
            if not reply.done():
                reply.set_exception(self._failure)
        for stream in self._streams.values():
            stream.put(self._failure)
        if serving:
            self.context["on_engine_failure"](message)
