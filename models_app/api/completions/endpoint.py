"""POST /v1/completions: the legacy text completion protocol on the one generate path.

``create_completion`` parses the body into the typed request with a raw ``prompt``, runs it
through ``api.inference.generate`` (admission, capability checks, scheduler and error codes are
the runtime's, shared with /v1/responses and /v1/chat/completions) and shapes the
``text_completion`` answer; a model whose engine forwards the client's body (the managed
servers, openai_remote: to their server's own /v1/completions) answers with its upstream's own
JSON (``api.passthrough``); see ``api.openai_protocol``.  ``completions_app`` serves it from
ASGI, at its path in the route table (``api.routes``).
"""
from __future__ import annotations

from models_app.api.completions.protocol import COMPLETIONS_PATH, parse_completion_body
from models_app.api.completions.shapes import CompletionBuilder
from models_app.api.inference import inference_app
from models_app.api.openai_protocol import openai_create

create_completion = openai_create(parse_completion_body, CompletionBuilder)
completions_app = inference_app(create_completion, COMPLETIONS_PATH)
