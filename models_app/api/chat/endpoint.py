"""POST /v1/chat/completions: the second protocol on the one generate path.

``create_chat_completion`` parses the body into the same typed request as /v1/responses, runs
it through ``api.inference.generate`` (admission, capability checks, scheduler and error codes
are the runtime's, shared by every protocol) and shapes the chat completions answer; a model
whose engine forwards the client's body (the managed servers, openai_remote) answers with its
upstream's own JSON (``api.passthrough``); see ``api.openai_protocol``.
``chat_completions_app`` serves it from ASGI, at its path in the route table (``api.routes``).
"""
from __future__ import annotations

from models_app.api.chat.protocol import CHAT_COMPLETIONS_PATH, parse_chat_body
from models_app.api.chat.shapes import ChatCompletionBuilder
from models_app.api.inference import inference_app
from models_app.api.input_tokens import token_counter
from models_app.api.openai_protocol import openai_create

create_chat_completion = openai_create(parse_chat_body, ChatCompletionBuilder)
chat_completions_app = inference_app(create_chat_completion, CHAT_COMPLETIONS_PATH)

# POST /v1/chat/completions/input_tokens: the body's prompt tokens (api.input_tokens).
chat_input_tokens_app = inference_app(
    token_counter(parse_chat_body, lambda request: request.forwarded,
                  lambda tokens: {"object": "chat.completion.input_tokens", "input_tokens": tokens}),
    CHAT_COMPLETIONS_PATH + "/input_tokens",
    limited=False,  # counting takes no engine time: no key's limits apply
)
