"""Token counting endpoints: a protocol's body counted as the prompt it would be.

POST /v1/messages/count_tokens, /v1/chat/completions/input_tokens and /v1/responses/input_tokens
parse their body with their protocol's own parser (the same 400s), and ask the runtime (op
``count_tokens``, ``runtime.inference.token_count``) how many tokens the model's tokenizer makes of
the prompt its chat template renders; the answer is ``shape(input_tokens)``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from models_app import placement
from models_app.api.inference import Create, parsed, runtime_wire
from models_app.api.keys import Caller
from models_app.transport.messages import OP_COUNT_TOKENS
from runtime.inputs.request import InferenceRequest, typed_request, with_typed


def token_counter(parse: Callable[[Any, str | None], Any], runtime_request: Callable[[Any], InferenceRequest],
                  shape: Callable[[int], dict]) -> Create:
    """The entry point of a counting endpoint: ``parse(body, fairness_key)`` is the protocol's
    parser, ``runtime_request(parsed)`` the request in what it returns (either kind: the runtime
    checks a count as it would check the generation)."""

    async def create(data, caller: Caller) -> dict:
        request = runtime_request(await parsed(parse, data, caller.fairness_key))
        typed = typed_request(request)
        model = await caller.resolve(typed.model)
        wire = with_typed(request, dataclasses.replace(typed, stream=False)).to_wire()
        result = await placement.call(OP_COUNT_TOKENS, runtime_wire({**wire, "model": model}))
        return shape(result["input_tokens"])

    return create
