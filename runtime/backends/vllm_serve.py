"""vllm_serve: a managed local ``vllm serve`` subprocess, one per replica.

Same vLLM fields and load overrides as ``vllm``, plus how to start the
server.  ``target_inflight`` becomes ``--max-num-seqs``, so the extra args may
not set it.  The speculative fields become one ``--speculative-config`` JSON
and ``vllm_max_pixels`` is merged into ``--mm-processor-kwargs``, as the
in-process engine does (``runtime.backends.vllm.arguments``).  Only this
managed backend forwards a json_schema ``response_format``.
``vllm_tool_call_parser`` starts the server for tool calling:
``--enable-auto-tool-choice --tool-call-parser <parser>`` (the extra args may set neither);
without it vLLM refuses tools with the default tool_choice "auto".
"""
from __future__ import annotations

import json
from typing import Any

import runtime.backends.managed as managed
from runtime.backends.common_fields import GEMMA4, NonEmptyStr
from runtime.backends.vllm import VllmFields, VllmSpec
from runtime.backends.vllm.arguments import mm_processor_kwargs, speculative_config


class VllmServeDefinition(
    managed.server_fields(
        VllmFields,
        "vllm_serve",
        binary="vllm",
        startup_timeout_seconds=900.0,
        owned_flags={
            "target_inflight": ("--max-num-seqs",),
            "vllm_tool_call_parser": ("--enable-auto-tool-choice", "--tool-call-parser"),
        },
    )
):
    # the vllm_* fields of VllmFields and the vllm_serve_* ones of server_fields, and:
    # POST /v1/embeddings: ``--runner pooling`` (a generative architecture is converted to an
    # embedding model, vLLM's ``--convert auto``); the server then serves embeddings only.
    embeddings: bool = False
    # Tool calling: the vLLM tool parser of the model's call format (hermes, llama3_json,
    # mistral, pythonic, qwen3_coder, ...: whatever this vLLM registers; it checks at start).
    vllm_tool_call_parser: NonEmptyStr | None = None


def _json(value: dict | None) -> str | None:
    return json.dumps(value, separators=(",", ":")) if value else None


def vllm_serve_command(config: dict[str, Any], host: str, port: int, base_dir: str) -> list[str]:
    """The exact ``vllm serve`` argv for one replica of ``config`` (the effective definition)."""
    options = [
        "--max-num-seqs", str(config["target_inflight"]),
        "--tensor-parallel-size", str(config["vllm_tensor_parallel_size"]),
        "--dtype", config["vllm_dtype"],
        *managed.flag_args(
            ("--max-model-len", config["vllm_max_model_len"]),
            ("--gpu-memory-utilization", config["vllm_gpu_memory_utilization"]),
            ("--kv-cache-dtype", config["vllm_kv_cache_dtype"]),
            ("--kv-cache-memory-bytes", config["vllm_kv_cache_memory_bytes"]),
            ("--quantization", config["vllm_quantization"]),
            ("--reasoning-parser", config["vllm_reasoning_parser"]),
            ("--mm-processor-kwargs", _json(mm_processor_kwargs(config))),
            ("--speculative-config", _json(speculative_config(config))),
            ("--api-key", config["vllm_serve_api_key"]),
        ),
        *(["--enforce-eager"] if config["vllm_enforce_eager"] else []),
        *(["--trust-remote-code"] if config["vllm_trust_remote_code"] else []),
        *(["--runner", "pooling"] if config["embeddings"] else []),
        *_tool_args(config["vllm_tool_call_parser"]),
    ]
    model_args = ["serve", managed.server_target(config, "vllm_serve", base_dir)]
    return managed.server_argv(config, "vllm_serve", host, port, model_args, options)


def _tool_args(parser: str | None) -> list[str]:
    return ["--enable-auto-tool-choice", "--tool-call-parser", parser] if parser else []


VLLM_SERVE = managed.ServerProfile(
    program="vllm serve",
    prefix="vllm_serve",
    build=lambda config, site: managed.ServerLaunch(vllm_serve_command(config, site.host, site.port, site.base_dir)),
    json_schema=True,
)


class VllmServeSpec(managed.ManagedServerSpec, VllmSpec):
    """The vllm rules and load overrides, run by a managed ``vllm serve``."""

    profile = VLLM_SERVE
    definition_model = VllmServeDefinition
    thinking_families = (GEMMA4,)
    tools_field = "vllm_tool_call_parser"

    def embedding_dimensions(self, definition):
        """vLLM judges ``dimensions`` (a Matryoshka model takes it, any other refuses it)."""
        return True
