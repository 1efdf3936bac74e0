"""Speculative decoding's decode speed and acceptance on SmolLM2, in one run: llm-pool's llama_cpp
engine plain, with prompt lookup (``gguf_spec_type: ngram-simple``) and with SmolLM2 drafting for
itself (``draft-simple``), and llama-server (the ``llama_server`` backend) plain, with its
``ngram-simple`` and ``ngram-mod`` modes and with SmolLM2 as its draft model (``draft-simple``).

Every model is one replica on the same GGUF and threads in one ``manage.py serve``; they take
turns, one request at a time: ``--rounds`` rounds of each repetitive prompt (code to extend, a
table to copy: answers that repeat their input), greedy, streamed, ``max_tokens`` N.  Each request's
figures are the runtime's own (``GET /v1/admin/activity``): its decode tokens/s (output tokens
after the first over the time after the first), its drafted and accepted tokens.

Prints one JSON object: per model the median decode tokens/s, the drafted and accepted totals
and the acceptance rate, and its speed-up over the same engine's plain model.
Run: .venv/bin/python bench/speculative.py [--binary PATH] [--rounds 3] [--max-tokens 96] [--threads 2]
     [--only pool|server]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import httpx

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.warm_turns import SMOLLM2, llama_server_binary, local_file, pool_service  # noqa: E402

ADMIN_TOKEN = "bench-speculative-admin"
TABLE = "\n".join(f"| {i} | part-{i:03d} | {i * 7 % 13} kg | shelf {chr(65 + i % 5)} | in stock |" for i in range(1, 13))
CODE = "\n\n".join(f"def area_{name}(width, height):\n    \"\"\"The area of a {name}.\"\"\"\n    return width * height"
                   for name in ("door", "window", "wall", "floor"))
PROMPTS = [
    f"Copy this table exactly, every row:\n{TABLE}",
    f"Here is some Python:\n{CODE}\n\nWrite the same functions again for roof, gate, shelf and table.",
]
# name -> (backend, the definition's speculative fields)
MODELS = {
    "pool-plain": ("llama_cpp", {}),
    "pool-ngram-simple": ("llama_cpp", {"gguf_spec_type": "ngram-simple", "gguf_spec_draft_n_max": 8}),
    "pool-draft-simple": ("llama_cpp", {"gguf_spec_type": "draft-simple", "gguf_spec_draft_model": SMOLLM2,
                                        "gguf_spec_draft_n_max": 4}),
    "server-plain": ("llama_server", {}),
    "server-ngram-simple": ("llama_server", {"llama_server_spec_type": "ngram-simple",
                                             "llama_server_spec_ngram_n_max": 8, "llama_server_spec_ngram_size_n": 3}),
    "server-ngram-mod": ("llama_server", {"llama_server_spec_type": "ngram-mod", "llama_server_spec_ngram_n_max": 16,
                                          "llama_server_spec_draft_n_min": 2, "llama_server_spec_ngram_size_n": 8}),
    "server-draft-simple": ("llama_server", {"llama_server_spec_type": "draft-simple",
                                             "llama_server_draft_model": local_file(SMOLLM2),
                                             "llama_server_spec_draft_n_max": 4}),
}


def chosen(args: argparse.Namespace) -> list[str]:
    """The models of this run: every one, or ``--only``'s engine's."""
    return [name for name in MODELS if args.only is None or name.startswith(args.only + "-")]


def settings(args: argparse.Namespace) -> dict:
    models = {}
    for name in chosen(args):
        backend, fields = MODELS[name]
        if backend == "llama_cpp":
            base = {"model_path": SMOLLM2, "gguf_n_ctx": args.ctx, "gguf_n_gpu_layers": 0,
                    "gguf_n_threads": args.threads, "gguf_flash_attn": "off"}
        else:
            base = {"model_path": local_file(SMOLLM2), "llama_server_binary": args.binary,
                    "llama_server_n_ctx": args.ctx, "llama_server_n_gpu_layers": 0, "llama_server_flash_attn": "off",
                    "llama_server_extra_args": ["--threads", str(args.threads)]}
        models[name] = {"backend": backend, "enabled": True, **base, **fields}
    return {"service": {"log_level": "warning", "admin_token": ADMIN_TOKEN}, "models": models}


def ask(http: httpx.Client, model: str, prompt: str, max_tokens: int) -> None:
    """One streamed answer, read to its end: streamed, the runtime's record sees its first token
    when the engine makes it (an answer forwarded unstreamed arrives whole)."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{model}: {response.status_code} {response.read()[:500]!r}")
        for _ in response.iter_lines():
            pass


def figures(http: httpx.Client, model: str, measured: int) -> dict:
    """The runtime's records of the model's last ``measured`` requests, summed up."""
    response = http.get("/v1/admin/activity", params={"model": model, "limit": measured},
                        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    response.raise_for_status()
    items = response.json()["requests"]
    speeds = [item["tokens_per_second"] for item in items if item["tokens_per_second"] is not None]
    drafted = sum(item["draft_tokens"] or 0 for item in items)
    accepted = sum(item["accepted_draft_tokens"] or 0 for item in items)
    return {
        "requests": len(items),
        "decode_tokens_per_second": round(statistics.median(speeds), 2) if speeds else None,
        "per_request_tokens_per_second": speeds,
        "output_tokens": sum(item["output_tokens"] for item in items),
        "draft_tokens": drafted,
        "accepted_draft_tokens": accepted,
        "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", help="llama-server (default: the one scripts/build_llama_server.sh built)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--only", choices=["pool", "server"], help="one engine's models (default: both)")
    args = parser.parse_args()
    args.binary = llama_server_binary(args.binary) if args.only != "pool" else None
    names = chosen(args)
    results = {}
    with pool_service(settings(args)) as url, httpx.Client(base_url=url, timeout=600) as http:
        for name in names:
            ask(http, name, "Say hello.", 8)  # warm: the first request pays for page faults
        for _ in range(args.rounds):  # the models take turns round by round: drift hits them alike
            for name in names:
                for prompt in PROMPTS:
                    ask(http, name, prompt, args.max_tokens)
        for name in names:
            results[name] = figures(http, name, args.rounds * len(PROMPTS))
    for name, result in results.items():
        plain = results[name.split("-")[0] + "-plain"]["decode_tokens_per_second"]
        speed = result["decode_tokens_per_second"]
        result["speedup_over_plain"] = round(speed / plain, 2) if speed and plain else None
    print(json.dumps({
        "model": SMOLLM2, "threads": args.threads, "rounds": args.rounds, "max_tokens": args.max_tokens,
        "llama_server": args.binary, "results": results,
    }, indent=2))


if __name__ == "__main__":
    main()
