"""The vLLM engine in the runtime process: one ``AsyncLLM`` per replica.

``runtime.backends.vllm.arguments`` maps the effective definition to
``AsyncEngineArgs`` keyword arguments.

Prompts are rendered from the tokenizer's chat template in the sandbox of
``runtime.inputs.chat_templates`` (``enable_thinking`` per request for Qwen3 / Gemma 4)
and passed to vLLM as token ids.

LoRA adapters (runtime.backends.shared.adapters): the engine is built for every declared one
(``max_loras``) and each one ``adapters_loaded`` keeps is loaded with ``AsyncLLM.add_lora`` once
the engine stands; a request for one carries its ``LoRARequest``.  A reconfigure, whose one
field here is ``adapters_loaded``, calls ``add_lora`` / ``remove_lora`` on the running engine:
the weights, the KV cache and the engine stay.

Unload calls ``AsyncLLM.shutdown()``, which stops the EngineCore process that
holds the weights, the KV cache and the CUDA graphs, so that memory returns to
the device.  When the last vLLM engine of the process is gone,
``vllm.distributed.parallel_state.cleanup_dist_env_and_memory()`` tears down
vLLM's distributed state and empties the CUDA cache of this process.  What only
a process exit frees: the CUDA context of this process (when anything in it
initialised CUDA) and memory of an engine core that runs in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) which vLLM fails to release.
"""
from __future__ import annotations

import asyncio
import gc
import inspect
from types import SimpleNamespace
from typing import Any

from runtime.backends.base import EngineUnavailable, Finished, GenerationRequest, TextDelta
from runtime.backends.shared.adapters import adapter_paths, declared, require_loaded, vllm_lora_arguments
from runtime.backends.shared.prompts import render_template_prompt, template_messages, template_variables
from runtime.backends.vllm.arguments import engine_arguments, model_target
from runtime.errors import BackendError, InvalidLoadRequest, InvalidRequest, LLMPoolError

# Engines loaded in this process; the distributed cleanup runs when the last one unloads.
_live_engines: set[int] = set()


def import_vllm() -> SimpleNamespace:
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.lora.request import LoRARequest
        from vllm.sampling_params import RequestOutputKind, SamplingParams
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as exc:
        raise EngineUnavailable(
            f"vLLM is not installed in this environment ({exc}); install vllm on a CUDA machine "
            "to load models with the vllm backend"
        ) from exc
    return SimpleNamespace(
        AsyncEngineArgs=AsyncEngineArgs, AsyncLLM=AsyncLLM, SamplingParams=SamplingParams,
        DELTA=RequestOutputKind.DELTA, LoRARequest=LoRARequest,
    )


def sampling_arguments(request: GenerationRequest) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments; the optional ones only when the request sets them
    (vLLM's own defaults otherwise).  ``logprobs`` is vLLM's count of alternatives per token
    (0: the sampled token's only), which it reports from the model's raw distribution."""
    arguments = {"max_tokens": request.max_output_tokens, "temperature": request.temperature, "top_p": request.top_p}
    for name in ("seed", "presence_penalty", "frequency_penalty", "logprobs", "top_k"):
        if getattr(request, name) is not None:
            arguments[name] = getattr(request, name)
    if request.repeat_penalty is not None:
        arguments["repetition_penalty"] = request.repeat_penalty
    return arguments


def token_logprobs(completion, top: int) -> list[dict]:
    """The chat completions logprobs entries of a delta's tokens, from vLLM's per-token
    ``{token_id: Logprob(logprob, rank, decoded_token)}`` (the sampled token always among them)."""
    entries = []
    for token_id, candidates in zip(completion.token_ids, completion.logprobs or ()):
        ranked = sorted(candidates.items(), key=lambda item: item[1].rank)
        entries.append({
            **_logprob_entry(candidates[token_id]),
            "top_logprobs": [_logprob_entry(candidate) for _, candidate in ranked if candidate.rank <= top][:top],
        })
    return entries


def _logprob_entry(candidate) -> dict:
    text = candidate.decoded_token or ""
    return {"token": text, "logprob": float(candidate.logprob), "bytes": list(text.encode("utf-8"))}


def _cleanup_process_state() -> None:
    """vLLM's documented teardown of distributed state and cached device memory."""
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    except ImportError:
        return
    cleanup_dist_env_and_memory()


class VllmEngine:
    def __init__(self, config: dict[str, Any], context: dict):
        self.config = config
        self.engine_args = {
            **engine_arguments(config, model_target(config["model_path"], context["base_dir"])),
            **vllm_lora_arguments(config),
        }
        # Every declared adapter -> (vLLM's LoRA id: 1, 2, ... in declared order, its folder); an
        # adapter keeps its id while it is dropped and added back.
        self._adapters = {name: (index + 1, path) for index, (name, path)
                          in enumerate(adapter_paths(config, context["base_dir"], every=True).items())}
        self._loaded: set[str] = set()  # the adapters vLLM holds (add_lora)
        self._on_failure = context["on_engine_failure"]
        self._vllm: SimpleNamespace | None = None
        self._llm = None
        self._tokenizer = None

    async def load(self) -> None:
        self._vllm = import_vllm()
        args = self._vllm.AsyncEngineArgs(**self.engine_args)
        # Blocking: starts the EngineCore process and waits for weights, profiling and CUDA graphs.
        llm = await asyncio.to_thread(self._vllm.AsyncLLM.from_engine_args, args)
        try:
            tokenizer = llm.get_tokenizer()
            if inspect.isawaitable(tokenizer):  # vLLM releases before the renderer made it synchronous
                tokenizer = await tokenizer
            if not getattr(tokenizer, "chat_template", None):
                raise ValueError(f"the tokenizer of {self.engine_args['model']} has no chat template")
            for name in declared(self.config):
                await self._add_lora(llm, name)
        except BaseException:
            await asyncio.to_thread(llm.shutdown)
            raise
        self._llm, self._tokenizer = llm, tokenizer
        _live_engines.add(id(self))

    async def unload(self) -> None:
        llm, self._llm, self._tokenizer = self._llm, None, None
        if llm is None:
            return
        await asyncio.to_thread(llm.shutdown)
        del llm
        _live_engines.discard(id(self))
        gc.collect()
        if not _live_engines:
            await asyncio.to_thread(_cleanup_process_state)

    async def reconfigure(self, config: dict[str, Any], overlap: bool = False) -> None:
        """Take ``config``'s ``adapters_loaded`` (the one reconfigurable field of vllm): vLLM's
        ``add_lora`` for each adapter it adds, then ``remove_lora`` for each it drops, on the
        running engine.  An adapter vLLM cannot load is 400 invalid_load_request, the ones this
        call added removed again: the adapters stay as they were."""
        if self._llm is None:
            raise BackendError("the vLLM engine is not loaded")
        wanted = declared(config)
        added = []
        try:
            for name in [name for name in wanted if name not in self._loaded]:
                await self._add_lora(self._llm, name)
                added.append(name)
        except ValueError as exc:
            for name in added:
                await self._remove_lora(name)
            raise InvalidLoadRequest(str(exc), param="adapters_loaded") from None
        for name in [name for name in self._adapters if name in self._loaded and name not in wanted]:
            await self._remove_lora(name)
        self.config = config

    async def _add_lora(self, llm, name: str) -> None:
        """``add_lora`` of a declared adapter (vLLM reads its folder now, not at its first request);
        ValueError naming it where vLLM cannot load it."""
        lora_id, path = self._adapters[name]
        try:
            added = await llm.add_lora(self._vllm.LoRARequest(name, lora_id, path))
        except Exception as exc:
            raise ValueError(f"vLLM could not load the LoRA adapter {name!r} from {path}: {exc}") from None
        if not added:
            raise ValueError(f"vLLM did not load the LoRA adapter {name!r} from {path}")
        self._loaded.add(name)

    async def _remove_lora(self, name: str) -> None:
        await self._llm.remove_lora(self._adapters[name][0])
        self._loaded.discard(name)

    def prompt_text(self, request: GenerationRequest) -> str:
        tokenizer = self._tokenizer
        return render_template_prompt(
            tokenizer.chat_template,
            template_messages(request),
            bos_token=getattr(tokenizer, "bos_token", None) or "",
            eos_token=getattr(tokenizer, "eos_token", None) or "",
            **template_variables(request, self.config["enable_thinking"]),
        )

    async def generate(self, request: GenerationRequest):
        if self._llm is None:
            raise BackendError("the vLLM engine is not loaded")
        lora = None
        if request.adapter is not None:
            require_loaded(request.adapter, self._loaded)
            lora_id, path = self._adapters[request.adapter]
            lora = self._vllm.LoRARequest(request.adapter, lora_id, path)
        if request.prompt is not None:  # a raw prompt: tokenized as vLLM's own /v1/completions does
            prompt_ids = list(self._tokenizer.encode(request.prompt, add_special_tokens=True))
        else:
            prompt_ids = list(self._tokenizer.encode(self.prompt_text(request), add_special_tokens=False))
        params = self._vllm.SamplingParams(**sampling_arguments(request), output_kind=self._vllm.DELTA)
        output_tokens, finish_reason = 0, "stop"
        try:
            async for output in self._llm.generate({"prompt_token_ids": prompt_ids}, params, request.request_id,
                                                   lora_request=lora):
                completion = output.outputs[0]
                output_tokens += len(completion.token_ids)
                logprobs = None if request.logprobs is None else token_logprobs(completion, request.logprobs)
                if completion.text or logprobs:
                    yield TextDelta(completion.text, tokens=len(completion.token_ids), logprobs=logprobs)
                if output.finished:
                    finish_reason = "length" if completion.finish_reason == "length" else "stop"
        except LLMPoolError:
            raise
        except ValueError as exc:  # vLLM's request validation (prompt longer than max_model_len, ...)
            raise InvalidRequest(f"vLLM refused the request: {exc}", param="input") from exc
        except Exception as exc:
            if getattr(self._llm, "errored", False):
                self._on_failure(f"the vLLM engine died: {exc or type(exc).__name__}")
            raise BackendError(f"vLLM generation failed: {exc or type(exc).__name__}") from exc
        yield Finished(input_tokens=len(prompt_ids), output_tokens=output_tokens, finish_reason=finish_reason)
