"""The route table of the inference edge: each path served by a plain ASGI app (no Django), and
the protocol handler that serves it.

Every client protocol is a translation onto the one typed request (``runtime.inputs.request``):
its package parses the body, ``api.inference.generate`` runs it, and the package shapes the answer.
A path that is not here goes on to Django (the admin API, the browser pages).
"""
from __future__ import annotations

from models_app.api.chat.endpoint import chat_completions_app, chat_input_tokens_app
from models_app.api.completions.endpoint import completions_app
from models_app.api.embeddings.endpoint import embeddings_app
from models_app.api.messages.endpoint import count_tokens_app, messages_app
from models_app.api.ollama.endpoint import OLLAMA_ROUTES
from models_app.api.responses.endpoint import responses_app, responses_input_tokens_app

INFERENCE_ROUTES = {
    "/v1/responses": responses_app,
    "/v1/chat/completions": chat_completions_app,
    "/v1/completions": completions_app,
    "/v1/embeddings": embeddings_app,
    "/v1/messages": messages_app,
    "/v1/messages/count_tokens": count_tokens_app,
    "/v1/chat/completions/input_tokens": chat_input_tokens_app,
    "/v1/responses/input_tokens": responses_input_tokens_app,
    **OLLAMA_ROUTES,  # Ollama's API (/api/chat, /api/tags ...): GET paths too, each app checks its method
}
