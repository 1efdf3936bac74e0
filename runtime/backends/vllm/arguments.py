"""How a vllm definition becomes vLLM engine arguments (shared with ``vllm_serve``).

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
"""
from __future__ import annotations

import os
from typing import Any

from runtime.backends.base import resolve_model_path

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
