"""What every inference protocol shares: the one generate exchange with the runtime, and the
plain-ASGI front that serves a protocol without Django's request machinery.

Each protocol (``api/responses/``, ``api/chat/``) parses its body into the same
``GenerationRequest`` (chat completions and completions: inside a ``ForwardedRequest`` with the
client's body) and shapes the answer its own way; between the two, ``generate`` is the
one path to the runtime (admission, capability checks, scheduler and error codes all live
there).  ``inference_app`` serves a protocol's ``create`` function straight from ASGI: Django's
request handling costs a new thread-sensitive executor per request and several thread hops
(the request_started/request_finished signals, rendering a DRF response, closing it), about
4.5 ms of a 5.3 ms answer of a fast model.

A stream whose model loads for it (``load_on_request``) opens before the runtime admits it:
the runtime says it waits (its ``waiting`` chunk), the front answers the stream's headers and
sends the protocol's waiting notice (an SSE comment ``: loading <model>``, or the Messages API's
``ping`` event) at once and every ``LOADING_NOTICE_SECONDS`` until the wait ends, then the
protocol's stream.  Errors before the wait keep their HTTP status; an
error that ends the wait (model_failed, model_loading after load_wait_timeout_seconds) is the
stream's error event.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from models_app import placement
from models_app.api.client_timeouts import StreamWriteTimeout, stream_write
from models_app.api.errors import Envelope, error_answer, internal_error, openai_envelope, send_error, send_json
from models_app.api.keys import Caller, key_ring
from models_app.api.limits import parse_json
from models_app.conf import service_settings
from models_app.quotas import admission
from models_app.transport.messages import OP_EMBED, OP_GENERATE, REPLY_CHUNK, REPLY_RESULT
from runtime.errors import LLMPoolError, MethodNotAllowed, RequestTooLarge
from runtime.json_codec import dumps
from runtime.inference.admission import estimate_prompt_tokens
from runtime.inputs.request import GENERATE_ADMITTED, GENERATE_WAITING, InferenceRequest, typed_request

logger = logging.getLogger("llmpool.api")

MAX_BODY_BYTES = 64 * 1024 * 1024
# A body at least this large is parsed (its JSON, then its protocol's schema) on a worker thread,
# so the event loop goes on serving the other requests meanwhile; a smaller one parses on the loop,
# faster than the hop to a thread (a 10,000-message conversation takes about 0.1 s to parse).
OFF_LOOP_BODY_BYTES = 256 * 1024
STREAM_HEADERS = [
    (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no"),
]

# How often a stream that waits for its model's load says so (an SSE comment: clients ignore it,
# and it keeps idle proxies and client read timeouts from closing the stream).
LOADING_NOTICE_SECONDS = 3.0



@dataclass(frozen=True)
class PlainAnswer:
    """An answer that is not JSON (a transcript as text, SubRip or WebVTT), sent whole."""

    body: bytes
    content_type: str = "text/plain; charset=utf-8"


# A protocol's entry point: (the parsed body, its caller) -> an answer object, a plain answer or SSE bytes.
Create = Callable[[Any, Caller], Awaitable["dict | PlainAnswer | AsyncIterator[bytes]"]]
# A protocol's body parser: (the body, the request's headers by lower-case name) -> what its entry
# point takes; it raises the request's error (400) for a body it refuses.
ParseBody = Callable[[bytes, dict[str, str]], Any]


def json_body(body: bytes, headers: dict[str, str]) -> Any:
    """The body as JSON whatever its content type (an empty body: ``{}``)."""
    return parse_json(body) if body else {}


class _EarlyStream:
    """Set by the ASGI front for its request (``_EARLY``): lets ``generate`` return a stream while
    the runtime still waits for the model's load (``admission``, the rest of that wait)."""

    def __init__(self):
        self.model: str | None = None
        self.admission: asyncio.Task | None = None
        self.exchange = None

    async def close(self) -> None:
        """End the wait and the exchange (the runtime cancels the request) unless already over."""
        if self.admission is not None and not self.admission.done():
            self.admission.cancel()
            await asyncio.gather(self.admission, return_exceptions=True)
        if self.exchange is not None:
            await self.exchange.aclose()


_EARLY: ContextVar[_EarlyStream | None] = ContextVar("llmpool_early_stream", default=None)

# The inference path being served: the runtime's metrics and activity label requests by it.
ENDPOINT: ContextVar[str | None] = ContextVar("llmpool_endpoint", default=None)

# The caller of the request being served: the runtime queues the request on its terms.
_CALLER: ContextVar[Caller | None] = ContextVar("llmpool_caller", default=None)

# Whether the request being served has a large body (``OFF_LOOP_BODY_BYTES``): its protocol parses
# it off the loop (``parsed``).
_LARGE_BODY: ContextVar[bool] = ContextVar("llmpool_large_body", default=False)


async def parsed(parse: Callable[..., Any], *args):
    """``parse(*args)``: a protocol's parse of the request's body, on a worker thread for a large body."""
    if _LARGE_BODY.get():
        return await asyncio.to_thread(parse, *args)
    return parse(*args)


def runtime_wire(wire: dict) -> dict:
    """A generate / embed / count payload with what the edge decided outside the body, when known:
    the path it came in on (``endpoint``), and the class and queue timeout its caller's key and
    headers give it (``Caller.queue_terms``)."""
    endpoint, caller = ENDPOINT.get(), _CALLER.get()
    extra = caller.queue_terms() if caller is not None else {}
    if endpoint is not None:
        extra["endpoint"] = endpoint
    return {**wire, **extra} if extra else wire


async def generate(request: InferenceRequest, model: str) -> dict | AsyncIterator[dict]:
    """Run ``request`` in the runtime on ``model``, the model its name means (``Caller.resolve``;
    the request keeps the client's name, which the answer shows): its result (``text``,
    ``finish_reason``, ``usage``), or, for a stream, an iterator of the runtime's messages
    (``chunk`` deltas, then the ``result``).

    Raises the request's error (LLMPoolError) before anything is sent: a stream is returned
    only once the runtime has admitted the request (its ``admitted`` chunk), or, under the ASGI
    front, once it waits for the model's load (the front then says so until the wait ends); a
    non-streamed request gets one reply, its result or its error.  Errors after that are raised
    by the stream's iterator; closing it early cancels the request in the runtime.  A request
    whose client leaves before its answer is charged what it used (``_charge_if_cancelled``).
    """
    wire = runtime_wire({**request.to_wire(), "model": model})
    charge = _charge_if_cancelled(model, request)
    if not typed_request(request).stream:
        result = await placement.call(OP_GENERATE, wire, on_cancelled=charge)
        admission.count(model, result["usage"])
        return result
    return await runtime_stream(OP_GENERATE, wire, model, on_cancelled=charge)


def _charge_if_cancelled(model: str, request) -> Callable[[dict], None] | None:
    """For a generate of a key's request: what counts what the request used when its client leaves
    before the answer (``RuntimeClient.exchange``'s ``on_cancelled``), so that leaving early is
    never a way round the key's limits; where the runtime's count does not come, the prompt's
    estimate (as the scheduler charges it) and the chunks relayed.  None for a request of no key:
    nothing waits then."""
    if admission.CURRENT.get() is None:
        return None
    return lambda used: admission.count(model, {"input_tokens": estimate_prompt_tokens(typed_request(request)), **used})


async def runtime_stream(op: str, wire: dict, model: str,
                         on_cancelled: Callable[[dict], None] | None = None) -> AsyncIterator[dict]:
    """A streamed request ``op`` (generate, transcribe) with its payload ``wire``, for ``model``:
    returned, as ``generate`` says, once the runtime admitted it (or it waits for its model's load
    under the ASGI front); an iterator of the runtime's chunk messages, then its result.

    A generate that the client closes early is charged to its key all the same
    (``on_cancelled``: ``_charge_if_cancelled``), before the key's grant finishes."""
    exchange = placement.exchange(op, wire, on_cancelled=on_cancelled)
    early = _EARLY.get()
    try:
        waiting_for = await _until_admitted(exchange, stop_when_waiting=early is not None)
    except BaseException:
        await exchange.aclose()
        raise
    if waiting_for is None:
        return _stream(exchange, model)
    early.model, early.exchange = waiting_for, exchange
    early.admission = asyncio.ensure_future(_until_admitted(exchange, stop_when_waiting=False))
    return _stream(exchange, model, early.admission)


async def _until_admitted(exchange, *, stop_when_waiting: bool) -> str | None:
    """Consume the exchange until the runtime has admitted the request (errors raise here), or,
    with ``stop_when_waiting``, until it says the request waits for a load: then the model's name."""
    async for message in exchange:
        if message["kind"] != REPLY_CHUNK:
            continue
        event = message["data"].get("event")
        if event == GENERATE_ADMITTED:
            return None
        if event == GENERATE_WAITING and stop_when_waiting:
            return message["data"].get("model") or "model"
    return None


async def _stream(exchange, model: str, load_wait: asyncio.Task | None = None) -> AsyncIterator[dict]:
    try:
        if load_wait is not None:
            await load_wait  # the end of the wait for the load: its error raises here
        async for message in exchange:
            if message["kind"] == REPLY_RESULT:
                admission.count(model, message["data"].get("usage") or {})
            if message["kind"] in (REPLY_CHUNK, REPLY_RESULT):
                yield message
    finally:
        if load_wait is not None and not load_wait.done():
            load_wait.cancel()
            await asyncio.gather(load_wait, return_exceptions=True)
        await exchange.aclose()


async def embed(embedding, model: str) -> dict:
    """Run ``embedding`` (a typed embeddings request) in the runtime on ``model``: ``vectors`` and
    ``usage`` (``prompt_tokens``, charged to the caller's key)."""
    result = await placement.call(OP_EMBED, runtime_wire({**embedding.to_wire(), "model": model}))
    admission.count(model, result["usage"])
    return result


def json_bytes(data) -> bytes:
    """JSON as DRF's JSONRenderer writes it (compact, UTF-8)."""
    return dumps(data)


DONE = b"data: [DONE]\n\n"  # the end of an OpenAI-style stream


def sse_data(payload) -> bytes:
    """One ``data: <json>`` server-sent event."""
    return b"data: " + json_bytes(payload) + b"\n\n"


def sse_error(exc: LLMPoolError) -> bytes:
    """The end of an OpenAI-style stream that fails after it started: the error envelope (the
    one error writer's) as its last ``data:`` event, then ``[DONE]`` (the openai client raises it
    as an ``APIError``)."""
    return sse_data(error_answer(exc).body) + DONE


class _Disconnected(Exception):
    pass


def loading_comment(model: str) -> bytes:
    """The OpenAI-style protocols' notice that a stream waits: an SSE comment, which clients ignore."""
    return f": loading {model}\n\n".encode()


def inference_app(create: Create, path: str, *, envelope: Envelope = openai_envelope,
                  waiting_notice: Callable[[str], bytes] = loading_comment, method: str = "POST",
                  stream_type: bytes = b"text/event-stream", parse_body: ParseBody = json_body,
                  max_body_bytes: Callable[[], int] = lambda: MAX_BODY_BYTES, limited: bool = True):
    """The ASGI application that serves ``create`` at ``path`` (``method`` only: a GET's
    ``create`` is given ``{}``); a stream it answers is of the media type ``stream_type``.

    It reads the body (at most ``max_body_bytes()``, 64 MiB by default, else 413), parses it with
    ``parse_body`` (by default as JSON whatever its content type), and answers JSON, a
    ``PlainAnswer`` or an event stream.  A client that disconnects cancels its request: the
    exchange closes, which tells the runtime to cancel the generation and free its slot.
    An error before the answer starts goes through the one error writer (``api.errors``), its
    body ``envelope(exc)`` (the protocol's own error shape); ``waiting_notice(model)`` is what a
    stream sends while it waits for its model (``_send_loading_notices``).  A ``limited`` path
    (one that runs a model) admits a key's request against the key's limits first
    (``quotas.admission``): over one, it answers the 429; else every answer carries the key's
    ``x-ratelimit-*`` headers, and the request holds its concurrency slot until it is answered
    (``grant.finish``, which also charges the answer's tokens).
    """

    async def app(scope, receive, send) -> None:
        if scope["method"] != method:
            await send_error(send, MethodNotAllowed(f'Method "{scope["method"]}" not allowed.'), {"Allow": method},
                             envelope=envelope)
            return
        grant, limit_headers = None, {}
        try:
            try:
                # The key first: a caller without one is refused before its body is read.
                headers = _headers(scope)
                caller = (await key_ring()).caller(headers.get)
                if limited:
                    grant = await admission.admit(caller.quota_key, caller.limits)
                    limit_headers = grant.headers if grant is not None else {}
                    if grant is not None and grant.refusal is not None:
                        raise grant.refusal
                body = await _read_body(receive, max_body_bytes())
            except _Disconnected:
                return
            except LLMPoolError as exc:
                await send_error(send, exc, limit_headers, envelope=envelope)
                return
            task = asyncio.current_task()
            watcher = asyncio.create_task(_watch_disconnect(receive, task))  # it ends only on a disconnect
            ENDPOINT.set(path)  # this request's own task: nothing else reads it
            _CALLER.set(caller)
            admission.CURRENT.set(grant)
            try:
                await _serve(create, path, caller, (body, headers, parse_body), send, envelope, waiting_notice,
                             [(b"content-type", stream_type), *STREAM_HEADERS[1:], *_encoded(limit_headers)],
                             limit_headers)
            except asyncio.CancelledError:
                if not watcher.done():
                    raise
                task.uncancel()
            finally:
                watcher.cancel()
        finally:
            if grant is not None:
                await grant.finish()

    return app


def _encoded(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]


def _headers(scope) -> dict[str, str]:
    """The request's headers by name (ASGI names are lower-case already); of a repeated one, the last."""
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}


async def _serve(create: Create, path: str, caller: Caller, request: tuple[bytes, dict[str, str], ParseBody],
                 send, envelope: Envelope, waiting_notice: Callable[[str], bytes],
                 stream_headers: list[tuple[bytes, bytes]], limit_headers: dict[str, str]) -> None:
    body, headers, parse_body = request
    early = _EarlyStream()
    token = _EARLY.set(early)
    large = len(body) >= OFF_LOOP_BODY_BYTES
    _LARGE_BODY.set(large)  # this request's own task: nothing else reads it
    try:
        data = await asyncio.to_thread(parse_body, body, headers) if large else parse_body(body, headers)
        answer = await create(data, caller)
    except LLMPoolError as exc:
        await send_error(send, exc, limit_headers, envelope=envelope)
        return
    except Exception:
        await send_error(send, internal_error(f"POST {path}"), limit_headers, envelope=envelope)
        return
    finally:
        _EARLY.reset(token)
    if isinstance(answer, dict):
        await send_json(send, 200, json_bytes(answer), limit_headers)
        return
    if isinstance(answer, PlainAnswer):
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", answer.content_type.encode("latin-1")), (b"content-length", str(len(answer.body)).encode()),
            *_encoded(limit_headers),
        ]})
        await send({"type": "http.response.body", "body": answer.body})
        return
    try:
        await send({"type": "http.response.start", "status": 200, "headers": stream_headers})
        if early.admission is not None:
            await _send_loading_notices(send, early, waiting_notice(early.model))
        async for event in answer:
            await stream_write(send, {"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except StreamWriteTimeout:
        # The client read nothing for stream_write_timeout_seconds: closing the answer cancels the
        # request in the runtime (its slot is freed); the server closes the unfinished response.
        logger.warning("POST %s: the client read nothing for %g s; its stream was ended", path,
                       service_settings().stream_write_timeout_seconds)
    finally:
        await answer.aclose()
        await early.close()


async def _send_loading_notices(send, early: _EarlyStream, notice: bytes) -> None:
    """While the request waits for its model's load: ``notice`` (``: loading <model>`` for the
    OpenAI-style protocols) now and every ``LOADING_NOTICE_SECONDS`` until the wait is over (how
    it ended, the stream then tells)."""
    while True:
        await stream_write(send, {"type": "http.response.body", "body": notice, "more_body": True})
        done, _ = await asyncio.wait((early.admission,), timeout=LOADING_NOTICE_SECONDS)
        if done:
            return


async def _read_body(receive, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RequestTooLarge(f"the request body is larger than {limit / (1024 * 1024):g} MiB")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _watch_disconnect(receive, task: asyncio.Task) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            task.cancel()
            return
