"""sglang_serve: a managed local ``sglang serve`` process group, one per replica.

``target_inflight`` becomes ``--max-running-requests``, so the extra args may
not set it.  With speculative top-k 1, llm-pool derives the draft-token count
as the step count plus 1 and passes it explicitly; a conflicting explicit value
is rejected.  ``sglang_tool_call_parser`` (``--tool-call-parser``, which the extra args may
not set) starts the server for tool calling: SGLang then parses its model's calls.
"""
from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, model_validator

import runtime.backends.shared.managed as managed
import runtime.backends.shared.server_spec as server_spec
from runtime.backends.shared.common_fields import GEMMA4, FamilyDefinition, hf_kv_bytes_per_token, server_parts
from runtime.backends.shared.overrides import LoadOverride, integer_override
from runtime.errors import InvalidLoadRequest

SglangCacheDType = Literal[
    "auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "mxfp8", "nvfp4", "fp4_mx_block16", "fp4_e2m1"
]
SGLANG_CACHE_DTYPES = list(get_args(SglangCacheDType))
DEFAULT_NUM_STEPS = 5
DEFAULT_NUM_DRAFT_TOKENS = 6
DEFAULT_EAGLE_TOPK = 1


def derived_draft_tokens(num_steps: int | None, eagle_topk: int | None) -> int | None:
    """The draft-token count llm-pool passes when top-k is 1; None when SGLang needs an explicit one."""
    if (eagle_topk or DEFAULT_EAGLE_TOPK) != 1:
        return None
    return (num_steps or DEFAULT_NUM_STEPS) + 1


class SglangServeDefinition(
    server_spec.server_fields(
        FamilyDefinition,
        "sglang_serve",
        binary="sglang",
        startup_timeout_seconds=900.0,
        owned_flags={
            "target_inflight": ("--max-running-requests",),
            "sglang_tool_call_parser": ("--tool-call-parser",),
        },
    )
):
    sglang_quantization: str | None = None
    sglang_attention_backend: str | None = None
    sglang_reasoning_parser: str | None = None
    # Tool calling: SGLang's parser of the model's call format (hermes, qwen, qwen25, llama3,
    # mistral, pythonic, deepseekv3, qwen3_coder, gpt-oss, ...: whatever this SGLang knows).
    sglang_tool_call_parser: str | None = None
    sglang_context_length: int | None = Field(None, ge=1)
    # A startup ceiling; it must still hold the target and assistant weights.
    sglang_mem_fraction_static: float | None = Field(None, gt=0, le=1)
    sglang_max_total_tokens: int | None = Field(None, ge=1)
    sglang_chunked_prefill_size: int | None = Field(None, ge=-1)
    sglang_kv_cache_dtype: SglangCacheDType | None = None
    sglang_speculative_algorithm: str | None = None
    sglang_speculative_draft_model: str | None = None
    sglang_speculative_num_steps: int | None = Field(None, ge=1)
    sglang_speculative_num_draft_tokens: int | None = Field(None, ge=1)
    sglang_speculative_eagle_topk: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _draft_tokens_follow_the_steps(self):
        derived = derived_draft_tokens(self.sglang_speculative_num_steps, self.sglang_speculative_eagle_topk)
        explicit = self.sglang_speculative_num_draft_tokens
        if derived is not None and explicit is not None and explicit != derived:
            raise ValueError(
                f"sglang_speculative_num_draft_tokens must be sglang_speculative_num_steps + 1 ({derived}) "
                "when sglang_speculative_eagle_topk is 1"
            )
        return self


def _speculative_args(config: dict[str, Any]) -> list[str]:
    if config["sglang_speculative_algorithm"] is None:
        return []
    return server_spec.flag_args(
        ("--speculative-algorithm", config["sglang_speculative_algorithm"]),
        ("--speculative-draft-model-path", config["sglang_speculative_draft_model"]),
        ("--speculative-num-steps", config["sglang_speculative_num_steps"] or DEFAULT_NUM_STEPS),
        ("--speculative-eagle-topk", config["sglang_speculative_eagle_topk"] or DEFAULT_EAGLE_TOPK),
        ("--speculative-num-draft-tokens", config["sglang_speculative_num_draft_tokens"]),
    )


def sglang_serve_command(config: dict[str, Any], host: str, port: int, base_dir: str) -> list[str]:
    """The exact ``sglang serve`` argv for one replica of ``config`` (the effective config)."""
    options = [
        "--max-running-requests", str(config["target_inflight"]),
        *server_spec.named_flags(config, "sglang", "context_length", "mem_fraction_static", "max_total_tokens",
                                 "chunked_prefill_size", "kv_cache_dtype", "quantization", "attention_backend",
                                 "reasoning_parser", "tool_call_parser"),
        *_speculative_args(config),
        *server_spec.named_flags(config, "sglang_serve", "api_key"),
    ]
    model_args = ["serve", "--model-path", managed.server_target(config, "sglang_serve", base_dir)]
    return server_spec.server_argv(config, "sglang_serve", host, port, model_args, options)


SGLANG_SERVE = managed.ServerProfile(
    program="sglang serve",
    prefix="sglang_serve",
    build=lambda config, site: managed.ServerLaunch(sglang_serve_command(config, site.host, site.port, site.base_dir)),
)


def _effective(definition: SglangServeDefinition, overrides: dict[str, Any], key: str) -> Any:
    return overrides[key] if key in overrides else getattr(definition, key)


class SglangServeSpec(server_spec.ManagedServerSpec):
    profile = SGLANG_SERVE
    definition_model = SglangServeDefinition

    def estimate_parts(self, definition, config, base_dir):
        """With ``sglang_max_total_tokens`` and a local checkpoint: its weights plus that many
        tokens of KV cache (from its config.json; 1 byte per value for an fp8/fp4 cache type,
        else 2); with ``sglang_mem_fraction_static`` alone: that share of the device."""
        paths = (definition.sglang_serve_model, definition.model_path)
        tokens = config.get("sglang_max_total_tokens")
        if tokens is not None:
            dtype = config.get("sglang_kv_cache_dtype") or "auto"
            per_token = hf_kv_bytes_per_token(base_dir, paths[0] or paths[1], 1 if dtype.startswith(("fp8", "fp4", "nvfp4", "mxfp8")) else 2)
            if per_token is not None:
                return server_parts(base_dir, paths, kv_cache_bytes=tokens * per_token)
        fraction = config.get("sglang_mem_fraction_static")
        return server_parts(base_dir, paths, device_fraction=fraction) if fraction is not None else None
    thinking_families = (GEMMA4,)
    tools_field = "sglang_tool_call_parser"
    overrides = (
        integer_override("sglang_context_length", 256, 256),
        LoadOverride(
            "sglang_mem_fraction_static", float, {"kind": "float", "minimum": 0.01, "maximum": 1.0, "step": 0.01}
        ),
        integer_override("sglang_max_total_tokens", 256, 256, unit="tokens"),
        integer_override("sglang_chunked_prefill_size", -1, 1),
        LoadOverride(
            "sglang_kv_cache_dtype",
            str,
            {"kind": "enum", "default": "auto", "allowed_values": list(SGLANG_CACHE_DTYPES)},
        ),
        LoadOverride(
            "sglang_speculative_algorithm",
            str,
            {
                "kind": "string_or_null",
                "format": "sglang_speculative_algorithm",
                "default": None,
                "examples": ["NEXTN"],
            },
        ),
        LoadOverride(
            "sglang_speculative_draft_model",
            str,
            {
                "kind": "string_or_null",
                "format": "hf_id_or_local_path",
                "default": None,
                "examples": ["google/gemma-4-26B-A4B-it-assistant"],
            },
        ),
        integer_override("sglang_speculative_num_steps", default=DEFAULT_NUM_STEPS),
        integer_override("sglang_speculative_num_draft_tokens", default=DEFAULT_NUM_DRAFT_TOKENS),
        integer_override("sglang_speculative_eagle_topk", default=DEFAULT_EAGLE_TOPK),
    )

    def check_override_combination(self, definition, overrides):
        explicit = overrides.get("sglang_speculative_num_draft_tokens")
        if explicit is None:
            return
        derived = derived_draft_tokens(
            _effective(definition, overrides, "sglang_speculative_num_steps"),
            _effective(definition, overrides, "sglang_speculative_eagle_topk"),
        )
        if derived is not None and explicit != derived:
            raise InvalidLoadRequest(
                f"sglang_speculative_num_draft_tokens must be sglang_speculative_num_steps + 1 ({derived}) "
                "when sglang_speculative_eagle_topk is 1",
                param="sglang_speculative_num_draft_tokens",
            )

    def effective_config(self, definition, overrides: dict[str, Any]) -> dict[str, Any]:
        """As the base, with the draft-token count derived (steps + 1) whenever top-k is 1."""
        merged = super().effective_config(definition, overrides)
        derived = derived_draft_tokens(merged["sglang_speculative_num_steps"], merged["sglang_speculative_eagle_topk"])
        if derived is not None:
            merged["sglang_speculative_num_draft_tokens"] = derived
        return merged
