"""Fake ``vllm serve``: vLLM's flags as llm-pool uses them (plus a few common ones), nothing else.

With ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` true in its environment (``1`` or ``true``, any case, as
vLLM reads it), it serves vLLM's runtime LoRA routes (``lora_route``)."""
from __future__ import annotations

import json
import os
import sys

from openai_fake import (
    UsageError,
    log_control,
    parse_flags,
    require_choice,
    require_float,
    require_int,
    require_json,
    run,
)

VALUED = {
    "--host", "--port", "--api-key", "--max-num-seqs", "--max-model-len", "--gpu-memory-utilization",
    "--kv-cache-dtype", "--kv-cache-memory-bytes", "--mm-processor-kwargs", "--speculative-config",
    "--tensor-parallel-size", "--dtype", "--quantization", "--reasoning-parser", "--served-model-name",
    "--seed", "--max-num-batched-tokens", "--runner", "--tool-call-parser", "--tool-parser-plugin",
    "--max-loras", "--max-lora-rank",
}
SWITCHES = {
    "--enforce-eager", "--trust-remote-code", "--enable-prefix-caching", "--enable-chunked-prefill",
    "--enable-auto-tool-choice", "--enable-sleep-mode", "--enable-lora",
}
CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "nvfp4")
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
SPECULATIVE_KEYS = {"method", "model", "num_speculative_tokens", "moe_backend", "attention_backend"}
# Tool parsers vLLM registers (vllm/tool_parsers/__init__.py; the list grows with its versions).
TOOL_PARSERS = (
    "deepseek_v3", "deepseek_v31", "glm45", "granite", "granite-20b-fc", "hermes", "hunyuan_a13b", "internlm",
    "jamba", "kimi_k2", "llama3_json", "llama4_json", "llama4_pythonic", "longcat", "minimax_m2", "mistral",
    "olmo3", "openai", "phi4_mini_json", "pythonic", "qwen3_coder", "qwen3_xml", "seed_oss", "step3", "xlam",
)


def lora_modules(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """``--lora-modules name=path ...`` (vLLM's nargs "+": every value up to the next flag) taken
    out of ``argv``: the rest, and the modules by name."""
    if "--lora-modules" not in argv:
        return argv, {}
    start = argv.index("--lora-modules")
    end = next((i for i in range(start + 1, len(argv)) if argv[i].startswith("-")), len(argv))
    values = argv[start + 1:end]
    if not values or not all("=" in value for value in values):
        raise UsageError(f"argument --lora-modules: expected name=path values (got {values})")
    return argv[:start] + argv[end:], dict(value.split("=", 1) for value in values)


# vLLM's runtime LoRA routes and the keys of their bodies (vllm/entrypoints/serve/lora/protocol.py).
LORA_ROUTES = {"/v1/load_lora_adapter": {"lora_name", "lora_path"}, "/v1/unload_lora_adapter": {"lora_name"}}


def lora_route(path: str, enabled: bool):
    """The handler of one runtime LoRA route, as vLLM's OpenAIServingModels answers it: 200 with a
    text; a body whose keys are not the route's (which llm-pool never sends), loading without
    ``--enable-lora`` or loading a name loaded already, 400; loading a path that is no folder, or
    unloading a name not loaded, 404.  Every call goes to the control log."""
    def handle(handler, body: bytes) -> None:
        request = json.loads(body)
        log_control({"method": "POST", "path": path, "body": request})
        name, state = request.get("lora_name"), handler.state
        with state["lock"]:
            loaded = name in state["adapters"]
            if set(request) != LORA_ROUTES[path]:
                refused = (400, f"the body's keys must be {sorted(LORA_ROUTES[path])}")
            elif path == "/v1/unload_lora_adapter":
                refused = None if loaded else (404, f"The lora adapter '{name}' cannot be found.")
            elif not enabled:
                refused = (400, "LoRA is not enabled")
            elif loaded:
                refused = (400, f"The lora adapter '{name}' has already been loaded.")
            elif not os.path.isdir(request["lora_path"]):
                refused = (404, f"No adapter found for {request['lora_path']}")
            else:
                refused = None
            if refused is None:
                (state["adapters"].discard if loaded else state["adapters"].add)(name)
        if refused is not None:
            handler._error(*refused)
            return
        text = f"Success: LoRA adapter '{name}' {'removed' if loaded else 'added'} successfully.".encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Content-Length", str(len(text)))
        handler.end_headers()
        handler.wfile.write(text)

    return handle


def parse(argv: list[str]) -> tuple[dict, dict]:
    if not argv or argv[0] != "serve":
        raise UsageError("the only subcommand here is 'serve'")
    rest, modules = lora_modules(argv[1:])
    options, positionals = parse_flags(rest, VALUED, SWITCHES, dashes=True)
    if modules and not options.get("--enable-lora"):
        raise UsageError("--lora-modules requires --enable-lora")
    require_int(options, "--max-loras", minimum=len(modules) or 1)
    require_int(options, "--max-lora-rank", minimum=1)
    if len(positionals) != 1:
        raise UsageError(f"serve takes exactly one model tag (got {positionals})")
    for name in ("--port", "--max-num-seqs", "--max-model-len", "--kv-cache-memory-bytes", "--tensor-parallel-size"):
        require_int(options, name, minimum=1)
    require_float(options, "--gpu-memory-utilization")
    require_choice(options, "--kv-cache-dtype", CACHE_DTYPES)
    require_choice(options, "--dtype", DTYPES)
    require_json(options, "--mm-processor-kwargs", {"max_pixels", "min_pixels", "do_pan_and_scan"})
    require_json(options, "--speculative-config", SPECULATIVE_KEYS)
    require_choice(options, "--runner", ("auto", "generate", "pooling", "draft"))
    auto_tools = bool(options.get("--enable-auto-tool-choice"))
    if auto_tools and "--tool-call-parser" not in options:
        raise UsageError("--enable-auto-tool-choice requires --tool-call-parser")
    if auto_tools and options["--tool-call-parser"] not in TOOL_PARSERS:
        raise UsageError(
            f"invalid tool call parser: {options['--tool-call-parser']} (chose from {{ {','.join(TOOL_PARSERS)} }})"
        )
    settings = {
        "model": options.get("--served-model-name") or positionals[0],
        "host": options.get("--host", "0.0.0.0"),
        "port": options.get("--port", "8000"),
        "api_key": options.get("--api-key"),
        # --runner pooling: embeddings only, as vLLM's (chat completions answer 400).
        "runner": options.get("--runner", "generate"),
        # Tool calls only with --enable-auto-tool-choice (without it, unlike vLLM, the fake
        # answers tools with text: the pass-through tests send tools to every fake).
        "tools": "auto" if auto_tools else None,
        # --enable-sleep-mode: /sleep, /wake_up, /is_sleeping (with VLLM_SERVER_DEV_MODE=1, as vLLM).
        "sleep_mode": bool(options.get("--enable-sleep-mode")),
        # --lora-modules: each adapter is a model name of its own, as vLLM serves them.
        "adapters": sorted(modules),
        "post_routes": {path: lora_route(path, bool(options.get("--enable-lora"))) for path in LORA_ROUTES}
        if os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0").strip().lower() in ("1", "true") else {},
    }
    return settings, {}


if __name__ == "__main__":
    sys.exit(run("vllm", parse))
