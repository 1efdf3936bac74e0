"""vllm: models run through vLLM's engine, by default in an engine process per replica.

This module holds the vLLM definition fields (shared with ``vllm_serve``) and
the live-load rules; ``runtime.backends.vllm.engine`` is the in-process engine
(``AsyncLLM``) and ``runtime.backends.vllm.arguments`` documents how each field
becomes an engine argument.
"""
from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, model_validator

from runtime.backends.base import SAMPLING_OPTIONS
from runtime.backends.shared.adapters import (
    ADAPTERS_LOADED,
    AdapterName,
    Adapters,
    adapters_field,
    check_loaded_names,
    refuse_undeclared_loaded,
)
from runtime.backends.shared.in_process import LibrarySpec
from runtime.backends.shared.common_fields import (
    GEMMA4,
    QWEN3,
    FamilyDefinition,
    LibraryFields,
    server_parts,
    thinking_for_families,
)
from runtime.backends.shared.overrides import MIB_256, LoadOverride, integer_override
from runtime.backends.vllm.engine import VllmEngine, import_vllm

# vLLM's --kv-cache-dtype choices (vllm/config/cache.py, CacheDType).
VllmCacheDType = Literal[
    "auto",
    "float16",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "nvfp4_ds_mla",
    "turboquant_k8v4",
    "turboquant_4bit_nc",
    "turboquant_k3v4_nc",
    "turboquant_3bit_nc",
    "int4_per_token_head",
    "int8_per_token_head",
    "fp8_per_token_head",
    "nvfp4",
    "nvfp4_4over6",
]
VLLM_CACHE_DTYPES = get_args(VllmCacheDType)
# The values the UI offers; the service accepts every dtype in VLLM_CACHE_DTYPES.
VLLM_UI_CACHE_DTYPES = ["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]


class VllmFields(FamilyDefinition):
    """Engine settings of both vLLM backends; null leaves vLLM's own default."""

    backend: Literal["vllm", "vllm_serve"]  # each definition narrows it
    vllm_max_model_len: int | None = Field(None, ge=1)
    # Keep low and size the cache with vllm_kv_cache_memory_bytes, or vLLM reserves most free VRAM.
    vllm_gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    vllm_kv_cache_dtype: VllmCacheDType | None = None
    vllm_kv_cache_memory_bytes: int | None = Field(None, ge=1)
    # Merged into vllm_mm_processor_kwargs as max_pixels.
    vllm_max_pixels: int | None = Field(None, ge=1)
    vllm_mm_processor_kwargs: dict[str, Any] = Field(default_factory=dict)
    vllm_speculative_method: str | None = None
    vllm_speculative_model: str | None = None
    vllm_speculative_moe_backend: str | None = None
    vllm_speculative_attention_backend: str | None = None
    vllm_num_speculative_tokens: int | None = Field(None, ge=1)
    vllm_tensor_parallel_size: int = Field(1, ge=1)
    vllm_dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "auto"
    vllm_quantization: str | None = None
    vllm_enforce_eager: bool = False
    vllm_trust_remote_code: bool = False
    vllm_reasoning_parser: str | None = None
    # LoRA adapters (PEFT folders), each a model id <model>:<adapter>, served with vLLM's LoRA
    # support (runtime.backends.shared.adapters); the largest rank among them where it exceeds vLLM's default.
    adapters: Adapters = adapters_field()
    vllm_max_lora_rank: int | None = Field(None, ge=1)
    # Which of them are loaded (null: all); a load override POST .../reconfigure changes live,
    # the engine kept (runtime.backends.vllm.engine, runtime.backends.vllm_serve.spec).
    adapters_loaded: list[AdapterName] | None = None

    @model_validator(mode="after")
    def _loaded_adapters_declared(self):
        refuse_undeclared_loaded(self)
        return self


class VllmDefinition(LibraryFields, VllmFields):
    backend: Literal["vllm"]


def _optional_string(name: str, fmt: str, examples: list[str]) -> LoadOverride:
    return LoadOverride(name, str, {"kind": "string_or_null", "format": fmt, "default": None, "examples": examples})


class VllmSpec(LibrarySpec, engine=VllmEngine, library=import_vllm):
    name = "vllm"
    definition_model = VllmDefinition
    overrides = (
        integer_override("vllm_max_model_len", 256, 256),
        LoadOverride(
            "vllm_kv_cache_dtype",
            str,
            {
                "kind": "enum",
                "default": "auto",
                "allowed_values": list(VLLM_UI_CACHE_DTYPES),
                "examples": ["auto", "fp8"],
            },
            also_accepted=tuple(d for d in VLLM_CACHE_DTYPES if d not in VLLM_UI_CACHE_DTYPES),
        ),
        integer_override("vllm_kv_cache_memory_bytes", MIB_256, MIB_256, unit="bytes", display_unit="mib"),
        integer_override("vllm_max_pixels", 200704, 200704, unit="pixels"),
        _optional_string("vllm_speculative_method", "vllm_speculative_method", ["mtp", "draft_model", "mlp_speculator"]),
        _optional_string("vllm_speculative_model", "hf_id_or_local_path", ["google/gemma-4-26B-A4B-it-assistant"]),
        _optional_string("vllm_speculative_moe_backend", "vllm_moe_backend", ["triton", "marlin"]),
        _optional_string(
            "vllm_speculative_attention_backend", "vllm_attention_backend", ["triton_attn", "flashinfer"]
        ),
        integer_override("vllm_num_speculative_tokens", default=1),
        ADAPTERS_LOADED,  # adapters dropped or added back while loaded, the engine kept
    )

    def check_override_combination(self, definition, overrides):
        """The adapters loaded must be the definition's."""
        check_loaded_names(definition, overrides.get("adapters_loaded"))

    def raw_prompt(self, definition) -> bool:
        """A raw prompt is tokenized as it is (special tokens parsed), without the chat template."""
        return True

    def thinking_modes(self, definition):
        return thinking_for_families(definition, (GEMMA4, QWEN3))

    def sampling_options(self, definition):
        """All of them, as SamplingParams arguments (vllm.engine.sampling_arguments)."""
        return list(SAMPLING_OPTIONS)

    def estimate_parts(self, definition, config, base_dir):
        """With ``vllm_kv_cache_memory_bytes`` vLLM sizes its cache to that budget (and leaves
        gpu_memory_utilization aside); without it vLLM takes ``vllm_gpu_memory_utilization`` of
        the device (its default 0.9), counted as that share of the device's total."""
        paths = (getattr(definition, f"{self.name}_model", None), definition.model_path)
        kv = config.get("vllm_kv_cache_memory_bytes")
        if kv is not None:
            return server_parts(base_dir, paths, kv_cache_bytes=kv)
        return server_parts(base_dir, paths, device_fraction=config.get("vllm_gpu_memory_utilization") or 0.9)
