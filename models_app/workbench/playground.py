"""The model page's playground and live log pane.

The playground is the browser talking to ``POST /v1/chat/completions`` itself, as any client
does (``static/llmpool_admin/playground.js``); the page only says which decoding fields the
model's capabilities allow and whether an inference key is needed.  The log pane reads
``model_logs``: the same stream as ``GET /v1/admin/models/{name}/logs?follow=true``, served
behind the staff login (the browser has the session, not the admin token)."""
from __future__ import annotations

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from models_app.api.errors import error_json_response
from models_app.api.model_logs import logs_follow, logs_tail
from models_app.conf import service_settings
from models_app.models import InferenceKey
from runtime.errors import LLMPoolError

# The decoding fields every chat request takes: (name, label, input attributes).
BASE_FIELDS = [
    ("max_tokens", "Max tokens", {"min": 1, "step": 1}),
    ("temperature", "Temperature", {"min": 0, "max": 2, "step": 0.05}),
    ("top_p", "Top p", {"min": 0.01, "max": 1, "step": 0.01}),
]
# Those a model takes only where capabilities.sampling_options lists them.
SAMPLING_FIELDS = {
    "seed": ("Seed", {"step": 1}),
    "presence_penalty": ("Presence penalty", {"min": -2, "max": 2, "step": 0.1}),
    "frequency_penalty": ("Frequency penalty", {"min": -2, "max": 2, "step": 0.1}),
    "top_k": ("Top k", {"min": 0, "step": 1}),
    "repeat_penalty": ("Repeat penalty", {"min": 0.05, "max": 10, "step": 0.05}),
}


def playground_context(entry: dict) -> dict:
    """What the playground's template needs: the numeric fields, the choice fields (thinking,
    reasoning_effort) where the model has more than one, and whether a key is asked for."""
    capabilities = entry.get("capabilities") or {}
    sampling = capabilities.get("sampling_options") or []
    numbers = [{"name": name, "label": label, "attrs": attrs} for name, label, attrs in BASE_FIELDS]
    numbers += [
        {"name": name, "label": label, "attrs": attrs}
        for name, (label, attrs) in SAMPLING_FIELDS.items()
        if name in sampling
    ]
    choices = []
    thinking = capabilities.get("thinking_modes") or []
    if len(thinking) > 1:
        choices.append({"name": "thinking", "label": "Thinking", "values": thinking})
    efforts = capabilities.get("reasoning_efforts") or []
    if efforts:
        choices.append({"name": "reasoning_effort", "label": "Reasoning effort", "values": efforts})
    return {
        "numbers": numbers,
        "choices": choices,
        "needs_key": bool(service_settings().api_keys) or InferenceKey.objects.exists(),
        "load_on_request": bool((entry.get("definition") or {}).get("load_on_request")),
    }


async def model_logs(request: HttpRequest, name: str) -> HttpResponse:
    """The log pane's stream: ``log`` events ``{"replica", "line"}``, the tail then each new line;
    the runtime's error envelope (with its status) when it refuses before the stream."""
    try:
        first = await logs_tail(name, None)
    except LLMPoolError as exc:
        return error_json_response(exc)
    response = StreamingHttpResponse(logs_follow(first, name), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
