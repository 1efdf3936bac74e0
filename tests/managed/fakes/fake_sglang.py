"""Fake ``sglang serve``: SGLang's server flags as llm-pool uses them (plus a few common ones)."""
from __future__ import annotations

import sys

from openai_fake import UsageError, parse_flags, require_choice, require_float, require_int, run

VALUED = {
    "--model-path", "--host", "--port", "--api-key", "--max-running-requests", "--context-length",
    "--mem-fraction-static", "--max-total-tokens", "--chunked-prefill-size", "--kv-cache-dtype",
    "--quantization", "--attention-backend", "--reasoning-parser", "--tool-call-parser",
    "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-steps",
    "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--tp-size", "--random-seed",
    "--served-model-name",
}
SWITCHES = {"--trust-remote-code", "--enable-metrics", "--disable-radix-cache"}
# Some of SGLang's FunctionCallParser.ToolCallParserEnum names (its server arguments check them).
TOOL_CALL_PARSERS = (
    "deepseekv3", "deepseekv31", "gemma4", "glm", "glm45", "gpt-oss", "hermes", "kimi_k2", "llama3", "mistral",
    "pythonic", "qwen", "qwen25", "qwen3_coder", "step3",
)
CACHE_DTYPES = ("auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "mxfp8", "nvfp4", "fp4_mx_block16", "fp4_e2m1")


def parse(argv: list[str]) -> tuple[dict, dict]:
    if not argv or argv[0] != "serve":
        raise UsageError("the only subcommand here is 'serve'")
    options, positionals = parse_flags(argv[1:], VALUED, SWITCHES, dashes=False)
    if positionals:
        raise UsageError(f"unrecognized arguments: {' '.join(positionals)}")
    if "--model-path" not in options:
        raise UsageError("the following arguments are required: --model-path")
    for name in ("--port", "--max-running-requests", "--context-length", "--max-total-tokens",
                 "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens"):
        require_int(options, name, minimum=1)
    require_int(options, "--chunked-prefill-size", minimum=-1)
    require_float(options, "--mem-fraction-static")
    require_choice(options, "--kv-cache-dtype", CACHE_DTYPES)
    require_choice(options, "--tool-call-parser", TOOL_CALL_PARSERS)
    if options.get("--speculative-eagle-topk") == "1" and "--speculative-num-steps" in options:
        expected = int(options["--speculative-num-steps"]) + 1
        if int(options.get("--speculative-num-draft-tokens", expected)) != expected:
            raise UsageError("speculative_num_draft_tokens must be speculative_num_steps + 1 when eagle_topk is 1")
    settings = {
        "model": options.get("--served-model-name") or options["--model-path"],
        "host": options.get("--host", "127.0.0.1"),
        "port": options.get("--port", "30000"),
        "api_key": options.get("--api-key"),
        "tools": "auto" if "--tool-call-parser" in options else None,
    }
    return settings, {}


if __name__ == "__main__":
    sys.exit(run("sglang", parse))
