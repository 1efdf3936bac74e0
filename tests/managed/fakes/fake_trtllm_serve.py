"""Fake ``trtllm-serve``: its click options as llm-pool uses them, and the LLM API YAML keys it checks."""
from __future__ import annotations

import sys

import yaml
from openai_fake import UsageError, parse_flags, require_choice, require_int, run

VALUED = {
    "--host", "--port", "--backend", "--config", "--extra_llm_api_options", "--reasoning_parser",
    "--tool_parser", "--log_level", "--tp_size", "--max_beam_width", "--max_batch_size", "--max_num_tokens",
    "--max_seq_len", "--kv_cache_free_gpu_memory_fraction", "--tokenizer",
}
SWITCHES = {"--trust_remote_code", "--enable_chunked_prefill"}
# ToolParserFactory.parsers (click.Choice checks --tool_parser against them).
TOOL_PARSERS = ("qwen3", "qwen3_coder", "kimi_k2", "deepseek_v3", "deepseek_v31", "deepseek_v32", "glm4")
TOP_LEVEL_KEYS = {
    "max_batch_size", "max_seq_len", "max_num_tokens", "enable_chunked_prefill", "kv_cache_config",
    "cuda_graph_config", "print_iter_log", "enable_attention_dp", "disable_overlap_scheduler", "attn_backend",
}
KV_CACHE_KEYS = {"max_gpu_total_bytes", "dtype", "free_gpu_memory_fraction", "enable_block_reuse", "max_tokens"}


def read_config(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as source:
            config = yaml.safe_load(source) or {}
    except OSError as exc:
        raise UsageError(f"cannot read --config {path}: {exc.strerror}") from None
    unknown = set(config) - TOP_LEVEL_KEYS | set(config.get("kv_cache_config") or {}) - KV_CACHE_KEYS
    if unknown:
        raise UsageError(f"unknown LLM API options in {path}: {sorted(unknown)}")
    if (config.get("kv_cache_config") or {}).get("dtype", "auto") not in ("auto", "fp8", "nvfp4"):
        raise UsageError("kv_cache_config.dtype must be auto, fp8 or nvfp4")
    return config


def parse(argv: list[str]) -> tuple[dict, dict]:
    options, positionals = parse_flags(argv, VALUED, SWITCHES, dashes=False)
    if len(positionals) != 1:
        raise UsageError(f"Got unexpected extra arguments or missing MODEL ({positionals})")
    require_int(options, "--port", minimum=1)
    require_choice(options, "--backend", ("pytorch", "tensorrt", "trt", "_autodeploy"))
    require_choice(options, "--tool_parser", TOOL_PARSERS)
    path = options.get("--config") or options.get("--extra_llm_api_options")
    config = read_config(path) if path else {}
    settings = {
        "model": positionals[0],
        "host": options.get("--host", "localhost"),
        "port": options.get("--port", "8000"),
        "api_key": None,
        "tools": "auto" if "--tool_parser" in options else None,
    }
    return settings, {"config": config}


if __name__ == "__main__":
    sys.exit(run("trtllm-serve", parse))
