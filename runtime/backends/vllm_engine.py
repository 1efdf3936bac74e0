"""The vLLM engine in the runtime process: one ``AsyncLLM`` per replica.

``engine_arguments`` maps the effective definition (load override applied) to
``AsyncEngineArgs`` keyword arguments, one engine argument per field:

- ``vllm_max_model_len`` -> ``max_model_len``, ``vllm_gpu_memory_utilization`` ->
  ``gpu_memory_utilization``, ``vllm_kv_cache_dtype`` -> ``kv_cache_dtype``,
  ``vllm_kv_cache_memory_bytes`` -> ``kv_cache_memory_bytes`` (vLLM then sizes the
  KV cache from it instead of the utilization fraction);
- ``vllm_mm_processor_kwargs`` plus ``vllm_max_pixels`` as its ``max_pixels`` ->
  ``mm_processor_kwargs``;
- the ``vllm_speculative_*`` fields -> ``speculative_config`` (``method``,
  ``model``, ``num_speculative_tokens`` (default 1), ``moe_backend``,
  ``attention_backend``); a null method means no speculative decoding;
- ``vllm_tensor_parallel_size``, ``vllm_dtype``, ``vllm_quantization``,
  ``vllm_enforce_eager``, ``vllm_trust_remote_code``, ``vllm_reasoning_parser``
  -> the engine argument of the same name.

A null field is left out, so vLLM's own default applies.  ``device`` is not an
engine argument: vLLM uses the GPUs the runtime process sees
(``CUDA_VISIBLE_DEVICES``).

Prompts are rendered from the tokenizer's chat template in the sandbox of
``runtime.chat_templates`` (``enable_thinking`` per request for Qwen3 / Gemma 4)
and passed to vLLM as token ids.

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
import os
from types import SimpleNamespace
from typing import Any

from runtime.backends.base import EngineUnavailable, Finished, GenerationRequest, TextDelta, resolve_model_path
from runtime.backends.prompts import render_template_prompt, template_messages, template_variables
from runtime.errors import BackendError, InvalidRequest, LLMPoolError

# Engines loaded in this process; the distributed cleanup runs when the last one unloads.
_live_engines: set[int] = set()

_DIRECT_ARGUMENTS = {
    "vllm_tensor_parallel_size": "tensor_parallel_size",
    "vllm_dtype": "dtype",
    "vllm_enforce_eager": "enforce_eager",
    "vllm_trust_remote_code": "trust_remote_code",
    "vllm_max_model_len": "max_model_len",
    "vllm_gpu_memory_utilization": "gpu_memory_utilization",
    "vllm_kv_cache_dtype": "kv_cache_dtype",
    "vllm_kv_cache_memory_bytes": "kv_cache_memory_bytes",
    "vllm_quantization": "quantization",
    "vllm_reasoning_parser": "reasoning_parser",
}
_SPECULATIVE_FIELDS = {
    "model": "vllm_speculative_model",
    "moe_backend": "vllm_speculative_moe_backend",
    "attention_backend": "vllm_speculative_attention_backend",
}


def _import_vllm() -> SimpleNamespace:
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.sampling_params import RequestOutputKind, SamplingParams
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as exc:
        raise EngineUnavailable(
            f"vLLM is not installed in this environment ({exc}); install vllm on a CUDA machine "
            "to load models with the vllm backend"
        ) from exc
    return SimpleNamespace(
        AsyncEngineArgs=AsyncEngineArgs, AsyncLLM=AsyncLLM, SamplingParams=SamplingParams, DELTA=RequestOutputKind.DELTA
    )


def model_target(model_path: str, base_dir: str) -> str:
    """A local model folder (relative to the settings file) when it exists, else the hub id as given."""
    resolved = resolve_model_path(model_path, base_dir)
    return resolved if os.path.exists(resolved) else model_path


def speculative_config(config: dict[str, Any]) -> dict[str, Any] | None:
    method = config["vllm_speculative_method"]
    if method is None:
        return None
    speculative = {"method": method, "num_speculative_tokens": config["vllm_num_speculative_tokens"] or 1}
    for argument, field in _SPECULATIVE_FIELDS.items():
        if config[field] is not None:
            speculative[argument] = config[field]
    return speculative


def mm_processor_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    merged = dict(config["vllm_mm_processor_kwargs"])
    if config["vllm_max_pixels"] is not None:
        merged["max_pixels"] = config["vllm_max_pixels"]
    return merged


def engine_arguments(config: dict[str, Any], model: str) -> dict[str, Any]:
    """``AsyncEngineArgs`` keyword arguments for the effective definition ``config``."""
    arguments: dict[str, Any] = {"model": model}
    for field, argument in _DIRECT_ARGUMENTS.items():
        if config[field] is not None:
            arguments[argument] = config[field]
    processor_kwargs = mm_processor_kwargs(config)
    if processor_kwargs:
        arguments["mm_processor_kwargs"] = processor_kwargs
    speculative = speculative_config(config)
    if speculative is not None:
        arguments["speculative_config"] = speculative
    return arguments


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
        self.engine_args = engine_arguments(config, model_target(config["model_path"], context["base_dir"]))
        self._on_failure = context["on_engine_failure"]
        self._vllm: SimpleNamespace | None = None
        self._llm = None
        self._tokenizer = None

    async def load(self) -> None:
        self._vllm = _import_vllm()
        args = self._vllm.AsyncEngineArgs(**self.engine_args)
        # Blocking: starts the EngineCore process and waits for weights, profiling and CUDA graphs.
        llm = await asyncio.to_thread(self._vllm.AsyncLLM.from_engine_args, args)
        try:
            tokenizer = llm.get_tokenizer()
            if inspect.isawaitable(tokenizer):  # vLLM releases before the renderer made it synchronous
                tokenizer = await tokenizer
            if not getattr(tokenizer, "chat_template", None):
                raise ValueError(f"the tokenizer of {self.engine_args['model']} has no chat template")
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
        prompt_ids = list(self._tokenizer.encode(self.prompt_text(request), add_special_tokens=False))
        params = self._vllm.SamplingParams(
            max_tokens=request.max_output_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            output_kind=self._vllm.DELTA,
        )
        output_tokens, finish_reason = 0, "stop"
        try:
            async for output in self._llm.generate({"prompt_token_ids": prompt_ids}, params, request.request_id):
                completion = output.outputs[0]
                output_tokens += len(completion.token_ids)
                if completion.text:
                    yield TextDelta(completion.text)
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
