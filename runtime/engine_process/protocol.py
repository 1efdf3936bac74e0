"""The frames between the runtime and an engine process.

One frame is a 4-byte big-endian length and a msgpack map of that many bytes.  Every
map has an ``op``; the rest depends on it:

runtime -> engine process
    ``load`` {backend, model_name, config, replica_index, context}   answered by ``loaded``
        {tool_call_formats} (the engine's, see runtime.inference.tool_calls.format_for; null: none) or ``error``
    ``generate`` {id, request}   answered by ``delta``* then ``finished`` or ``error``
    ``embed`` {id, inputs, dimensions}   answered by ``embedded`` or ``error``
    ``transcribe`` {id, request} answered by ``segment``* then ``transcribed`` or ``error`` (the
        engine's ``transcribe``, runtime.inference.transcription; the request's audio as bytes)
    ``rerank`` {id, query, documents}    answered by ``reranked`` or ``error``
    ``count`` {id, request}      answered by ``counted`` {id, input_tokens} (the engine's
        ``count_tokens``, runtime.inference.token_count) or ``error``
    ``cancel`` {id}              answered by ``cancelled`` once that generate (embed, transcribe,
        rerank) has stopped
    ``stats``                    answered by ``stats`` {rss_bytes, gpu_memory_bytes}
    ``unload``                   answered by ``unloaded``; the process then exits 0
    ``reconfigure`` {config, overlap?} answered by ``reconfigured`` once the engine's inference state (a
        llama_cpp context) is rebuilt over the same weights with ``config`` (``overlap`` true: the
        new one built before the old is freed), or ``error`` (the old state serving on); ``sleep`` /
        ``wake``: that state freed / built again (``slept`` / ``woken``)

engine process -> runtime
    ``delta`` {id, text, tokens, logprobs?}: all text of generation ``id`` produced since the
        last delta sent, how many tokens it holds and (when asked for) their logprobs entries
    ``deltas`` {deltas}: ``delta`` frames of several generations sent together (``Outbox``), each
        whole in the list, in their order (``unbatched`` gives them back)
    ``finished`` {id, input_tokens, output_tokens, finish_reason, cached_tokens, draft_tokens,
        accepted_tokens}: ``cached_tokens`` the prompt tokens reused from the engine's KV cache,
        the other two speculative decoding's drafted and accepted tokens (each null where the
        engine does not say)
    ``embedded`` {id, vectors, prompt_tokens}: the vectors of embed ``id``, one per input
    ``segment`` {id, segment}: one TranscriptSegment of transcription ``id``, as its wire dict
    ``transcribed`` {id, language, duration}: the end of transcription ``id``
    ``reranked`` {id, scores, prompt_tokens}: the scores of rerank ``id``, one per document
    ``error`` {id, reply_to, code, message}: ``id`` is the generation (or embed) or null, ``reply_to``
        the op that failed; ``code`` is the LLMPoolError code (``internal_error`` otherwise)
    ``failed`` {message}: the engine reported itself dead (``context["on_engine_failure"]``)
    ``progress`` {stage, fraction}: while loading, the engine's ``context["on_load_progress"]``
        (runtime.model.load_progress: a stage name and a fraction from 0 to 1, or null)

An op the receiver does not know is answered with an ``error`` (code
``unknown_operation``), never a crash, so new operations can be added one at a
time.  A frame that cannot be decoded is answered the same way; the length
prefix keeps the stream in step.
"""
from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgpack

from runtime.errors import LLMPoolError, UnknownOperation, error_from_dict

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 256 * 1024 * 1024

# Requests (runtime -> engine process).
LOAD, GENERATE, EMBED, CANCEL, STATS, UNLOAD = "load", "generate", "embed", "cancel", "stats", "unload"
COUNT, COUNTED = "count", "counted"  # runtime.inference.token_count
TRANSCRIBE, SEGMENT, TRANSCRIBED = "transcribe", "segment", "transcribed"  # runtime.inference.transcription
RERANK, RERANKED = "rerank", "reranked"  # runtime.inference.rerank
RECONFIGURE, SLEEP, WAKE = "reconfigure", "sleep", "wake"  # runtime.model.residency
RECONFIGURED, SLEPT, WOKEN = "reconfigured", "slept", "woken"
# Replies and events (engine process -> runtime); STATS answers with its own name.
LOADED, DELTA, FINISHED, EMBEDDED, CANCELLED, ERROR, FAILED, UNLOADED = (
    "loaded", "delta", "finished", "embedded", "cancelled", "error", "failed", "unloaded",
)
DELTAS = "deltas"
PROGRESS = "progress"


class ProtocolError(RuntimeError):
    """The stream is unusable (a frame over MAX_FRAME_BYTES)."""


class UndecodableFrame(ValueError):
    """One frame was not a msgpack map with an ``op``; the stream is still in step."""


def encode(message: dict[str, Any]) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(f"a {message.get('op')!r} frame of {len(body)} bytes is over {MAX_FRAME_BYTES}")
    return HEADER.pack(len(body)) + body


def decode(body: bytes) -> dict[str, Any]:
    try:
        message = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise UndecodableFrame(f"undecodable frame: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise UndecodableFrame("a frame must be a map with a string 'op'")
    if message["op"] == DELTAS and not (isinstance(message.get("deltas"), list) and all(
            isinstance(delta, dict) and delta.get("op") == DELTA for delta in message["deltas"])):
        raise UndecodableFrame("a 'deltas' frame must hold a list of 'delta' maps")
    return message


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message, or None once the other end closed the stream (between frames or not).

    Raises UndecodableFrame for a frame that is not a message (the next read goes on).
    """
    try:
        (length,) = HEADER.unpack(await reader.readexactly(HEADER.size))
        if length > MAX_FRAME_BYTES:
            raise ProtocolError(f"frame of {length} bytes announced; the limit is {MAX_FRAME_BYTES}")
        body = await reader.readexactly(length)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return decode(body)


def error_message(exc: BaseException, *, reply_to: str, id: int | None = None) -> dict[str, Any]:
    """The ``error`` frame for ``exc``: an LLMPoolError's code, message, param and details."""
    if not isinstance(exc, LLMPoolError):
        exc = LLMPoolError(str(exc) or type(exc).__name__)
    fields = {key: exc.to_dict()[key] for key in ("code", "message", "param", "details")}
    return {"op": ERROR, "id": id, "reply_to": reply_to, **fields}


def unknown_op(message: dict[str, Any]) -> dict[str, Any]:
    exc = UnknownOperation(f"unknown engine process operation {message.get('op')!r}")
    return error_message(exc, reply_to=str(message.get("op")), id=message.get("id"))


def error_from_message(message: dict[str, Any]) -> LLMPoolError:
    """The LLMPoolError an ``error`` frame carries (its class from the code)."""
    return error_from_dict({key: message.get(key) for key in ("code", "message", "param", "details")})


class Outbox:
    """The writing end of a stream, with deltas coalesced while the reader lags.

    Messages are written in order by one sender task.  A delta for a generation
    whose previous delta is still waiting to be written is appended to it, so when
    the socket is full (``drain`` waits) the text piles up in one frame instead of
    many.  Deltas of several generations sent one after the other (a batch step's)
    go out as one ``deltas`` frame, so the reader decodes one frame per step, not
    one per generation.  A message that cannot be encoded goes out as an ``error``
    for its id.  Once the other end is gone, sending does nothing.
    """

    def __init__(self, writer: asyncio.StreamWriter, high_water: int = 16 * 1024):
        self.writer = writer
        writer.transport.set_write_buffer_limits(high=high_water)
        self.closed = False
        self._queue: list[dict[str, Any]] = []
        self._unsent_delta: dict[Any, dict[str, Any]] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._sender = asyncio.get_running_loop().create_task(self._send_loop(), name="outbox")

    def send(self, message: dict[str, Any]) -> None:
        if self.closed:
            return
        if message["op"] == DELTA:
            pending = self._unsent_delta.get(message["id"])
            if pending is not None:
                merge_deltas(pending, message)
                return
            message = dict(message)
            self._unsent_delta[message["id"]] = message
        self._queue.append(message)
        self._idle.clear()
        self._wake.set()

    async def _send_loop(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                batch, self._queue = self._queue, []
                self._unsent_delta.clear()
                self.writer.write(b"".join(_frames(batch)))
                await self.writer.drain()
                if not self._queue:
                    self._idle.set()
        except ConnectionError:
            self.closed = True
            self._idle.set()

    async def flush(self) -> None:
        """Wait until everything sent so far is handed to the socket (or the other end is gone)."""
        await self._idle.wait()

    async def close(self) -> None:
        try:
            await self.flush()
        finally:
            self.closed = True
            self._sender.cancel()
            self.writer.close()


def merge_deltas(pending: dict[str, Any], message: dict[str, Any]) -> None:
    """Append delta ``message`` to ``pending`` (a delta of the same generation sent before it)."""
    pending["text"] += message["text"]
    pending["tokens"] = pending.get("tokens", 1) + message.get("tokens", 1)
    if message.get("logprobs") is not None:
        pending["logprobs"] = [*(pending.get("logprobs") or ()), *message["logprobs"]]


def unbatched(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages a frame carries: the deltas of a ``deltas`` frame, else the message itself."""
    return message["deltas"] if message["op"] == DELTAS else [message]


def _frames(batch: list[dict[str, Any]]):
    """The frames of ``batch``, each run of two deltas or more in one ``deltas`` frame."""
    run: list[dict[str, Any]] = []
    for message in [*batch, None]:
        if message is not None and message["op"] == DELTA:
            run.append(message)
            continue
        if len(run) > 1:
            try:
                yield encode({"op": DELTAS, "deltas": run})
            except (ProtocolError, TypeError, ValueError):  # the one at fault answers for itself alone
                yield from (_frame(delta) for delta in run)
        elif run:
            yield _frame(run[0])
        run = []
        if message is not None:
            yield _frame(message)


def _frame(message: dict[str, Any]) -> bytes:
    try:
        return encode(message)
    except (ProtocolError, TypeError, ValueError) as exc:
        return encode(error_message(exc, reply_to=message["op"], id=message.get("id")))
