"""Ollama's API served from ASGI: ``OLLAMA_ROUTES`` (path -> app), which ``api.routes`` adds.

Each app is ``api.inference.inference_app`` (the inference keys, the body limits, a
disconnect cancelling the request) with Ollama's error body.  /api/chat and /api/generate run
the typed request through ``api.inference.generate``, the one path to the runtime, and answer
an NDJSON stream (``stream`` true, Ollama's default) or one object.  A streamed request that
asks for a ``format`` is run whole (the runtime constrains only an answer it sends whole) and
streamed as its one final object.  /api/pull, /api/push, /api/create, /api/copy and
/api/delete answer 405 ``model_management_unsupported``: models are declared in settings.json.
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

from models_app import selectors
from models_app.api.errors import error_answer
from models_app.api.answer_stream import shaped_stream
from models_app.api.inference import embed, generate, inference_app, parsed
from models_app.api.keys import Caller
from models_app.api.ollama import models
from models_app.api.ollama.protocol import (
    ChatBody, EmbedBody, EmbeddingsBody, GenerateBody, ModelBody, OllamaCall, parse_chat, parse_embed,
    parse_embeddings, parse_generate, shown_model,
)
from models_app.api.ollama.shapes import ERROR_SCHEMA, NDJSON, Answer, error_body, line, waiting_notice
from models_app.api.openapi import KEYS_NOTE, LIMITED_NOTE, InferenceOperation
from runtime.errors import ModelManagementUnsupported


def _generating(parse: Callable[..., OllamaCall], chat: bool):
    async def create(data, caller: Caller) -> dict | AsyncIterator[bytes]:
        started = time.monotonic()
        call = await parsed(parse, data, caller.fairness_key)
        model = await caller.resolve(call.model)
        answer = Answer(call.model, chat=chat, started=started)
        if call.generation is None:
            await selectors.model_get(model)  # an unknown model is a 404 here too
            return _whole(answer.loaded(), call.stream)
        outcome = await generate(call.generation, model)
        if not call.generation.stream:
            return _whole(answer.final(outcome, whole=True), call.stream)
        return _ndjson(answer, outcome)

    return create


def _whole(data: dict, stream: bool) -> dict | AsyncIterator[bytes]:
    """One object: the answer of a request that did not stream, or the only line of one that did."""
    return _one(line(data)) if stream else data


async def _one(piece: bytes) -> AsyncIterator[bytes]:
    yield piece


def _ndjson(answer: Answer, messages: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    return shaped_stream(messages, chunk=answer.piece, result=lambda data: line(answer.final(data, whole=False)),
                         failure=lambda exc: line(error_answer(exc, envelope=error_body).body))


async def _embedded(parse: Callable, data, caller: Caller) -> tuple[str, dict, float]:
    started = time.monotonic()
    request = await parsed(parse, data, caller.fairness_key)
    model = await caller.resolve(request.model)
    result = await embed(request, model)
    return request.model, result, started


async def create_embed(data, caller: Caller) -> dict:
    model, result, started = await _embedded(parse_embed, data, caller)
    return {
        "model": model,
        "embeddings": result["vectors"],
        "total_duration": round((time.monotonic() - started) * 1e9),
        "prompt_eval_count": result["usage"]["prompt_tokens"],
    }


async def create_embeddings(data, caller: Caller) -> dict:
    _model, result, _started = await _embedded(parse_embeddings, data, caller)
    return {"embedding": result["vectors"][0]}


async def create_show(data, caller: Caller) -> dict:
    return await models.show(shown_model(data), caller)


async def list_tags(data, caller: Caller) -> dict:
    return await models.tags(caller)


async def list_running(data, caller: Caller) -> dict:
    return await models.ps(caller)


async def report_version(data, caller: Caller) -> dict:
    return models.version()


async def refuse_management(data, caller: Caller) -> dict:
    raise ModelManagementUnsupported(
        "llm-pool does not pull, push, create, copy or delete models: they are declared in settings.json "
        "(and local.json), and /api/tags lists them"
    )


def _app(create, path: str, method: str = "POST", *, chat: bool = True, limited: bool = False):
    """``limited``: the path runs a model, so a key's limits admit its requests."""
    return inference_app(create, path, envelope=error_body, waiting_notice=waiting_notice(chat), method=method,
                         stream_type=NDJSON, limited=limited)


_MANAGEMENT = ("/api/pull", "/api/push", "/api/create", "/api/copy")
OLLAMA_ROUTES = {
    "/api/version": _app(report_version, "/api/version", "GET"),
    "/api/tags": _app(list_tags, "/api/tags", "GET"),
    "/api/ps": _app(list_running, "/api/ps", "GET"),
    "/api/show": _app(create_show, "/api/show"),
    "/api/chat": _app(_generating(parse_chat, chat=True), "/api/chat", limited=True),
    "/api/generate": _app(_generating(parse_generate, chat=False), "/api/generate", chat=False, limited=True),
    "/api/embed": _app(create_embed, "/api/embed", limited=True),
    "/api/embeddings": _app(create_embeddings, "/api/embeddings", limited=True),
    **{path: _app(refuse_management, path) for path in _MANAGEMENT},
    "/api/delete": _app(refuse_management, "/api/delete", "DELETE"),
}


def _operation(path: str, body, summary: str, description: str, *, streams: bool = False,
               method: str = "post", limited: bool = False) -> InferenceOperation:
    """``limited``: the path runs a model, so a key's limits admit its requests (as ``_app``'s)."""
    note = LIMITED_NOTE if limited else KEYS_NOTE
    return InferenceOperation(path, body, summary, description + " Errors are Ollama's {\"error\": message} with "
                              "llm-pool's code beside it. " + note, streams=streams, method=method,
                              stream_type=NDJSON.decode(), tag="ollama", error_component="OllamaError",
                              error_schema=ERROR_SCHEMA)


# Ollama's API in the OpenAPI document (api.routes adds them to the inference operations).
OLLAMA_OPERATIONS = [
    _operation("/api/version", None, "Ollama's version (Ollama API)",
               f"The Ollama release whose API llm-pool follows ({{\"version\": \"{models.OLLAMA_VERSION}\"}}).",
               method="get"),
    _operation("/api/tags", None, "List the models (Ollama API)",
               "Every model and alias the caller may use, with name, model, modified_at, size, digest and details.",
               method="get"),
    _operation("/api/ps", None, "List the loaded models (Ollama API)",
               "The loaded models with size, size_vram, context_length and expires_at (from their ttl_seconds).",
               method="get"),
    _operation("/api/show", ModelBody, "Show a model (Ollama API)",
               "details, capabilities (completion, tools, thinking, vision, embedding), model_info (with "
               "general.architecture and <architecture>.context_length) and parameters of model (or name)."),
    _operation("/api/chat", ChatBody, "Chat (Ollama API)",
               "Runs the conversation on the model through the same admission, capability checks and scheduler as "
               "/v1/chat/completions: an NDJSON stream (one object a line, the last with done true, done_reason and "
               "the durations) unless stream is false. options num_predict, temperature, top_p, top_k, seed, stop, "
               "presence_penalty, frequency_penalty, repeat_penalty are carried (400 naming one the model's engine "
               "lacks); num_ctx is clamped to the loaded context; keep_alive is ignored unless "
               "service.ollama_keep_alive is on. A body without messages loads nothing and answers done_reason load.",
               streams=True, limited=True),
    _operation("/api/generate", GenerateBody, "Generate (Ollama API)",
               "As /api/chat for one prompt (and system, images); raw true sends the prompt without the chat "
               "template. suffix, template and context are 400.", streams=True, limited=True),
    _operation("/api/embed", EmbedBody, "Embed (Ollama API)",
               "The embeddings of input (a string or a list of strings) from a model whose capabilities.embeddings "
               "is true.", limited=True),
    _operation("/api/embeddings", EmbeddingsBody, "Embed one prompt (Ollama's older API)",
               "The embedding of prompt, as {\"embedding\": [...]}.", limited=True),
    *(_operation(path, ModelBody, f"{path.removeprefix('/api/').capitalize()} a model (Ollama API): refused",
                 "405 model_management_unsupported: llm-pool's models are declared in settings.json.")
      for path in _MANAGEMENT),
    _operation("/api/delete", ModelBody, "Delete a model (Ollama API): refused",
               "405 model_management_unsupported: llm-pool's models are declared in settings.json.", method="delete"),
]
