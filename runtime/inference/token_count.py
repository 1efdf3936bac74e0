"""Counting a request's prompt tokens with the model's own tokenizer and chat template (POST
/v1/messages/count_tokens, /v1/chat/completions/input_tokens, /v1/responses/input_tokens).

The edge sends the same request a generation would (either kind's wire form); the runtime takes
it through the same checks (``engine_request``: a model that would refuse the request
refuses its count with the same error) and the same admission (a model that is not loaded is 409
``model_not_loaded``, a ``load_on_request`` one loads for it) and asks the leased replica's engine.
A count holds its replica only while the engine tokenizes: it is charged nothing to the caller's
fair share.

An engine that counts has ``count_tokens(request) -> int``: the tokens of the prompt it would run
for ``request``, its chat template applied (the local engines: llama_cpp renders and tokenizes for
real; the stub counts the words it would read).  Any other engine (an upstream server's) answers
400 ``token_count_unsupported``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.errors import TokenCountUnsupported
from runtime.inference.admission import engine_request
from runtime.inputs.request import GenerationRequest, typed_request
from runtime.model.tickets import Ticket

if TYPE_CHECKING:
    from runtime.model.writer import ModelController
    from runtime.pool.model_pool import ModelPool


async def count_tokens(pool: ModelPool, payload: dict) -> dict:
    """The runtime's ``count_tokens`` op: a generate payload's ``{"input_tokens"}`` on its model."""
    controller, _ = pool.lookup_target(payload["model"])  # an adapter's id counts on its base's tokenizer
    runs = engine_request(controller.entry, payload, pool.settings.engine.decoding,
                          pool.startup_service["allow_remote_execution"])
    return {"input_tokens": await count_on_engine(controller, typed_request(runs))}


async def count_on_engine(controller: ModelController, request: GenerationRequest) -> int:
    """The prompt tokens of ``request`` on one replica of ``controller``'s model (checked already)."""
    entry = controller.entry
    ticket = Ticket(request.request_id, request.fairness_key)
    dispatched = await controller.admit(ticket)
    try:
        lease = await dispatched
        lease.check()
        count = getattr(lease.engine, "count_tokens", None)
        if count is None:
            raise TokenCountUnsupported(
                f"model {entry.name} (backend {entry.definition.backend}) cannot count tokens: its engine has no "
                "tokenizer llm-pool can reach",
                param="model",
            )
        tokens = await count(request)
        lease.check()
        return tokens
    finally:
        controller.finish(ticket, 0)
