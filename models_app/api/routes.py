"""The route table of the inference edge: each path served by a plain ASGI app (no Django), the
protocol handler that serves it, and how the OpenAPI document describes it.

Every client protocol is a translation onto the one typed request (``runtime.inputs.request``):
its package parses the body, ``api.inference.generate`` runs it, and the package shapes the answer.
A path that is not here goes on to Django (the admin API, the browser pages).  A path listed in
``INFERENCE_OPERATIONS`` too is in the OpenAPI document, its request body's schema written from
the pydantic model that validates it (``add_inference_operations``), or for the audio paths'
multipart form, which is checked in code, the schema written beside that code.
"""
from __future__ import annotations

from models_app.api.audio.endpoint import transcriptions_app, translations_app
from models_app.api.audio.protocol import FORM_SCHEMA as AUDIO_FORM_SCHEMA
from models_app.api.chat.endpoint import chat_completions_app, chat_input_tokens_app
from models_app.api.chat.protocol import ChatBody
from models_app.api.completions.endpoint import completions_app
from models_app.api.completions.protocol import CompletionBody
from models_app.api.embeddings.endpoint import embeddings_app
from models_app.api.embeddings.protocol import EmbeddingBody
from models_app.api.limits import MAX_RERANK_DOCUMENTS
from models_app.api.messages.endpoint import count_tokens_app, messages_app
from models_app.api.messages.protocol import CountTokensBody, MessagesBody
from models_app.api.messages.shapes import ERROR_SCHEMA as ANTHROPIC_ERROR_SCHEMA
from models_app.api.ollama.endpoint import OLLAMA_OPERATIONS, OLLAMA_ROUTES
from models_app.api.openapi import KEYS_NOTE, LIMITED_NOTE, InferenceOperation, with_inference_operations
from models_app.api.rerank.endpoint import RERANK_ROUTES
from models_app.api.rerank.protocol import RerankBody
from models_app.api.responses.endpoint import responses_app, responses_input_tokens_app
from models_app.api.responses.protocol import ResponsesBody

INFERENCE_ROUTES = {
    "/v1/responses": responses_app,
    "/v1/chat/completions": chat_completions_app,
    "/v1/completions": completions_app,
    "/v1/embeddings": embeddings_app,
    "/v1/audio/transcriptions": transcriptions_app,  # multipart/form-data, not JSON
    "/v1/audio/translations": translations_app,
    **RERANK_ROUTES,  # /v1/rerank and the paths other servers give it (/rerank, /v1/reranking)
    "/v1/messages": messages_app,
    "/v1/messages/count_tokens": count_tokens_app,
    "/v1/chat/completions/input_tokens": chat_input_tokens_app,
    "/v1/responses/input_tokens": responses_input_tokens_app,
    **OLLAMA_ROUTES,  # Ollama's API (/api/chat, /api/tags ...): GET paths too, each app checks its method
}


INFERENCE_OPERATIONS = [
    InferenceOperation(
        "/v1/responses", ResponsesBody, "Create a response (OpenAI Responses API)",
        "Runs one request on a loaded model. stream=true answers with server-sent events "
        "(response.created … response.output_text.delta … response.completed; a failure mid-stream is a "
        "final error event). " + LIMITED_NOTE,
        streams=True,
    ),
    InferenceOperation(
        "/v1/chat/completions", ChatBody, "Create a chat completion (OpenAI chat completions API)",
        "Runs one request on a loaded model, through the same admission, capability checks and scheduler "
        "as /v1/responses. stream=true answers with `data: <chat.completion.chunk>` server-sent events and "
        "`data: [DONE]`; stream_options.include_usage adds a last chunk with the usage. n must be 1. tools "
        "(functions), tool_choice and parallel_tool_calls need a model with capabilities.tools (else 400 "
        "tools_unsupported, unless tool_choice is \"none\"); calls come back as message.tool_calls "
        "(delta.tool_calls when streamed) with finish_reason tool_calls. " + LIMITED_NOTE,
        streams=True,
    ),
    InferenceOperation(
        "/v1/completions", CompletionBody, "Create a text completion (OpenAI legacy completions API)",
        "Runs one raw text prompt (no chat template) on a loaded model whose capabilities.raw_prompt is true "
        "(else 400 raw_prompt_unsupported), through the same admission, capability checks and scheduler as "
        "/v1/responses. prompt is one string (or a list of one); several prompts, token-id prompts, n or "
        "best_of > 1, echo, suffix, logit_bias and the fields chat completions refuses are 400 naming the "
        "field, except on a model that forwards the body to its upstream. stream=true answers with "
        "`data: <text_completion>` server-sent events and `data: [DONE]`; stream_options.include_usage adds "
        "a last chunk with the usage. " + LIMITED_NOTE,
        streams=True,
    ),
    InferenceOperation(
        "/v1/embeddings", EmbeddingBody, "Create embeddings (OpenAI embeddings API)",
        "The vectors of input (a string, a list of strings, a token array or a list of token arrays; at most "
        "2048 inputs, none empty) from a model whose capabilities.embeddings is true (else 400 "
        "embeddings_unsupported), through the same model lookup, lifecycle rejections, admission and scheduler "
        "as /v1/responses. encoding_format float (default) or base64 (little-endian float32, as OpenAI); "
        "dimensions only where the upstream judges it (vllm_serve, openai_remote), else 400 naming the field. "
        + LIMITED_NOTE,
        streams=False,
    ),
    InferenceOperation(
        "/v1/rerank", RerankBody, "Rerank documents by their relevance to a query (Jina / Cohere rerank API)",
        f"One relevance score per document (a string or an object with text; at most {MAX_RERANK_DOCUMENTS}, the "
        "query a non-empty string) from a model whose capabilities.rerank is true (else 400 rerank_unsupported), through the same "
        "model lookup, lifecycle rejections, admission and scheduler as /v1/embeddings. results are sorted by "
        "relevance_score, highest first, cut to top_n; each carries index (the document's place in the request) "
        "and, unless return_documents is false, document.text. Also served at /rerank and /v1/reranking. "
        + KEYS_NOTE,
        streams=False,
    ),
    InferenceOperation(
        "/v1/messages", MessagesBody, "Create a message (Anthropic Messages API)",
        "The same request as /v1/chat/completions in Anthropic's shapes (what Claude Code and the anthropic "
        "SDK send): system, messages with text, image, tool_use, tool_result and thinking blocks, tools and "
        "tool_choice, thinking, stop_sequences. stream=true answers with Anthropic's server-sent events "
        "(message_start ... message_stop, ping while the model loads or the request waits). Errors come in "
        "Anthropic's envelope (type error) with llm-pool's code kept. x-api-key is accepted as the API key. "
        + LIMITED_NOTE,
        streams=True, error_component="AnthropicError", error_schema=ANTHROPIC_ERROR_SCHEMA,
    ),
    InferenceOperation(
        "/v1/messages/count_tokens", CountTokensBody, "Count a message's input tokens (Anthropic Messages API)",
        "The input_tokens the same body would take on its model, from the model's own tokenizer and chat "
        "template (400 token_count_unsupported for a model that forwards to an upstream server). " + KEYS_NOTE,
        streams=False, error_component="AnthropicError", error_schema=ANTHROPIC_ERROR_SCHEMA,
    ),
    *(
        InferenceOperation(
            f"{path}/input_tokens", body, f"Count a request's input tokens ({api})",
            f"The input_tokens the same body would take on its model as a {path} request "
            f"({{\"object\": \"{kind}.input_tokens\", \"input_tokens\": n}}), from the model's own tokenizer and "
            "chat template, as POST /v1/messages/count_tokens counts (400 token_count_unsupported for a model that "
            "forwards to an upstream server). " + KEYS_NOTE,
            streams=False,
        )
        for path, body, api, kind in (
            ("/v1/chat/completions", ChatBody, "OpenAI chat completions API", "chat.completion"),
            ("/v1/responses", ResponsesBody, "OpenAI Responses API", "response"),
        )
    ),
    *(
        InferenceOperation(
            path, AUDIO_FORM_SCHEMA, summary,
            f"{what} (a multipart/form-data upload, as OpenAI takes it) from a model whose "
            "capabilities.audio_transcription is true (else 400 transcription_unsupported, before the model's state "
            "is looked at), through the same model lookup, lifecycle rejections, admission and scheduler as "
            "/v1/responses, charged the audio's length in tokens. response_format json (default) and verbose_json "
            "(segments, and words with timestamp_granularities[] word) answer JSON; text and srt answer text/plain, "
            "vtt text/vtt; stream=true (with json or text) answers with transcript.text.delta server-sent events "
            "and transcript.text.done. A file over service.audio_max_upload_bytes is 413 request_too_large (param "
            "file); an empty one, or one the engine cannot decode, 400 invalid_request. " + LIMITED_NOTE,
            streams=True, media_type="multipart/form-data", answer_types=("text/plain", "text/vtt"),
        )
        for path, summary, what in (
            ("/v1/audio/transcriptions", "Transcribe audio (OpenAI audio API)", "The speech in an audio file as text"),
            ("/v1/audio/translations", "Translate audio into English text (OpenAI audio API)",
             "The speech in an audio file as English text, whatever the language spoken"),
        )
    ),
    *OLLAMA_OPERATIONS,
]


def add_inference_operations(result: dict, generator, request, public) -> dict:
    """drf-spectacular's postprocessing hook (``SPECTACULAR_SETTINGS``): the document with the
    inference operations added."""
    return with_inference_operations(result, INFERENCE_OPERATIONS)
