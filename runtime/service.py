"""The runtime's operations, as the Channels consumer calls them.

``RuntimeService.handle(op, payload, emit)`` is the one entry point: admin
reads and writes, settings reload, and generation (whose text deltas go out
through ``emit`` while the request runs).  Everything here is plain asyncio.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from runtime.backends.base import Finished, GenerationRequest, TextDelta
from runtime.catalog import CatalogEntry
from runtime.config import parse_load_body
from runtime.errors import (
    BackendError,
    FileInputUnsupported,
    InvalidRequest,
    ModalityUnsupported,
    MultiTurnUnsupported,
    RemoteExecutionDisallowed,
    RequestTimeout,
    ResponseFormatUnsupported,
    ThinkingUnsupported,
    UnknownOperation,
)
from runtime.gpu import probe_gpus
from runtime.paths import state_dir
from runtime.pool import ModelPool
from runtime.scheduler import Ticket
from runtime.supervisor import sweep_stale_processes
from runtime.state import TransitionEvent
from runtime.read_models import gpu_model_entry, model_entry

logger = logging.getLogger("llmpool.runtime")

Emit = Callable[[dict], Awaitable[None]]

PART_MODALITY = {"input_image": "image", "input_audio": "audio"}


class RuntimeService:
    def __init__(self, settings_path: str, listeners: list[Callable[[TransitionEvent], None]] | None = None):
        """``listeners`` get every lifecycle transition of every model (see ``runtime.state``)."""
        self.pool = ModelPool(settings_path, listeners)
        self._requests: dict[str, asyncio.Task] = {}

    async def start(self, *, load_enabled: bool = True) -> None:
        # Managed servers a crashed runtime left behind die before anything loads.
        killed = await asyncio.to_thread(sweep_stale_processes, state_dir())
        if killed:
            logger.warning("killed %d managed server(s) left by a previous runtime", len(killed))
        await self.pool.start(load_enabled=load_enabled)

    async def shutdown(self) -> None:
        for task in list(self._requests.values()):
            task.cancel()
        await self.pool.shutdown()

    async def handle(self, op: str, payload: dict, emit: Emit) -> dict:
        handler = getattr(self, f"op_{op}", None)
        if handler is None:
            raise UnknownOperation(f"unknown runtime operation {op!r}")
        return await handler(payload, emit)

    # ---- admin -----------------------------------------------------------------------
    async def op_list_models(self, payload, emit) -> dict:
        return {"models": [model_entry(c) for c in self.pool.controllers.values()]}

    async def op_get_model(self, payload, emit) -> dict:
        return model_entry(self.pool.controller(payload["name"]))

    async def op_load(self, payload, emit) -> dict:
        body = parse_load_body(payload.get("body"))  # the only check of the schema: 422 before 404
        controller = self.pool.controller(payload["name"])
        replicas = body.pop("replicas", None)
        await controller.load(body, replicas)
        return model_entry(controller)

    async def op_unload(self, payload, emit) -> dict:
        controller = self.pool.controller(payload["name"])
        await controller.unload()
        return model_entry(controller)

    async def op_reload_settings(self, payload, emit) -> dict:
        return await self.pool.reload()

    async def op_gpu_memory(self, payload, emit) -> dict:
        gpus, error = await asyncio.to_thread(probe_gpus)
        models = [gpu_model_entry(c) for c in self.pool.controllers.values()]
        return {"gpus": gpus, "models": models, "error": error}

    async def op_catalog(self, payload, emit) -> dict:
        """What the Django catalog mirror stores."""
        return {
            "models": [
                {
                    "name": c.entry.name,
                    "backend": c.entry.definition.backend,
                    "enabled": c.entry.definition.enabled,
                    "definition": c.entry.definition_dict(),
                    "sources": list(c.entry.sources),
                }
                for c in self.pool.controllers.values()
            ],
            "service": self.pool.settings.service.model_dump(),
        }

    # ---- generation ------------------------------------------------------------------
    async def op_generate(self, payload, emit) -> dict:
        task = asyncio.current_task()
        request_id = payload["request_id"]
        self._requests[request_id] = task
        try:
            return await self._generate(payload, emit)
        finally:
            self._requests.pop(request_id, None)

    async def _generate(self, payload: dict, emit: Emit) -> dict:
        controller = self.pool.controller(payload["model"])
        request = self._build_request(payload)
        check_request(controller.entry, payload, self.pool.startup_service["allow_remote_execution"])
        ticket = Ticket(request.request_id, request.fairness_key, cost_estimate=estimate_prompt_tokens(request))
        pieces: list[str] = []
        finished: Finished | None = None
        dispatched = await controller.admit(ticket)
        try:
            if request.stream:  # the API answers a stream's headers only now: errors before this get their status
                await emit({"event": "admitted"})
            lease = await dispatched
            lease.check()
            limit = controller.entry.definition.request_timeout_seconds
            deadline = asyncio.timeout(limit)
            try:
                async with deadline:
                    async for event in lease.engine.generate(request):
                        lease.check()
                        if isinstance(event, TextDelta):
                            pieces.append(event.text)
                            if request.stream:
                                await emit({"event": "delta", "text": event.text})
                        else:
                            finished = event
            except TimeoutError:
                if not deadline.expired():
                    raise  # the engine's own timeout, not the model's limit
                # The deadline cancelled the engine's generate (its cancel path ran); the finally
                # below frees the slot.
                raise RequestTimeout(
                    f"model {controller.name} did not finish the request within "
                    f"request_timeout_seconds={limit:g}"
                ) from None
        finally:
            used = finished.input_tokens + finished.output_tokens if finished else ticket.cost_estimate + len(pieces)
            controller.finish(ticket, used)
        if finished is None:
            raise BackendError(f"the {controller.entry.definition.backend} engine ended without a result")
        return {
            "text": "".join(pieces),
            "finish_reason": finished.finish_reason,
            "usage": {"input_tokens": finished.input_tokens, "output_tokens": finished.output_tokens},
        }

    def _build_request(self, payload: dict) -> GenerationRequest:
        decoding = self.pool.settings.engine.decoding

        def pick(key, default):
            value = payload.get(key)
            return default if value is None else value

        return GenerationRequest(
            request_id=payload["request_id"],
            messages=payload["messages"],
            instructions=payload.get("instructions"),
            max_output_tokens=pick("max_output_tokens", decoding.max_output_tokens),
            temperature=pick("temperature", decoding.temperature),
            top_p=pick("top_p", decoding.top_p),
            thinking=pick("thinking", "default"),
            response_format=payload.get("response_format"),
            metadata=payload.get("metadata") or {},
            fairness_key=payload.get("fairness_key"),
            extra=payload.get("extra") or {},
            stream=bool(payload.get("stream")),
        )


def estimate_prompt_tokens(request: GenerationRequest) -> int:
    """A tokenizer-free prompt size (about four characters a token) for fair-share charging."""
    chars = len(request.instructions or "") + sum(
        len(part.get("text", "")) for message in request.messages for part in message["content"]
    )
    return chars // 4 + 1


def check_request(entry: CatalogEntry, payload: dict, allow_remote: bool) -> None:
    """Reject what the model cannot take (400/403) before it is queued."""
    spec, definition = entry.spec, entry.definition
    if spec.is_remote(definition) and not allow_remote:
        raise RemoteExecutionDisallowed(
            f"model {entry.name} runs on a remote service and service.allow_remote_execution is false"
        )
    capabilities = spec.capabilities(definition)
    for message in payload["messages"]:
        for part in message["content"]:
            kind = part.get("type")
            if kind == "input_file" and not capabilities["file_inputs"]:
                raise FileInputUnsupported(f"model {entry.name} does not accept file inputs", param="input")
            modality = PART_MODALITY.get(kind)
            if modality and modality not in capabilities["modalities"]:
                raise ModalityUnsupported(
                    f"model {entry.name} does not accept {modality} input "
                    f"(modalities: {', '.join(capabilities['modalities'])})",
                    param="input",
                )
    turns = [m for m in payload["messages"] if m["role"] in ("user", "assistant")]
    if len(turns) > 1 and not capabilities["multi_turn"]:
        raise MultiTurnUnsupported(f"model {entry.name} accepts a single user turn only", param="input")
    if not turns or turns[-1]["role"] != "user":
        raise InvalidRequest("the input must end with a user message", param="input")
    thinking = payload.get("thinking") or "default"
    if thinking not in capabilities["thinking_modes"]:
        raise ThinkingUnsupported(
            f"model {entry.name} does not accept thinking={thinking!r} "
            f"(accepted: {', '.join(capabilities['thinking_modes'])})",
            param="thinking",
        )
    response_format = payload.get("response_format")
    if response_format and response_format.get("type") != "text":
        kind = response_format.get("type")
        if kind not in capabilities["response_formats"] or payload.get("stream"):
            raise ResponseFormatUnsupported(
                f"model {entry.name} does not accept response_format {kind!r}"
                + (" with stream" if payload.get("stream") else ""),
                param="response_format",
            )
