"""Replica routing: how many later turns of conversations find their prefix in the KV cache of the
replica they are sent to, with prefix-affinity routing (``engine.routing.prefix_affinity``) and
with least-loaded routing, on one llm-pool model of two real SmolLM2 ``llama_cpp`` replicas
(``target_inflight`` 1, one thread each), in one run.

``--conversations`` conversations of ``--turns`` turns each, ``--concurrency`` of them at once (2
by default: a replica with one slot keeps one conversation, so two replicas keep two warm at a
time).  Each conversation has a system prompt of its own (about 150 SmolLM2 tokens) and short user
turns, each fed back its own greedy answers (8 tokens at most); between turns its client thinks
for a random 0 to ``--think`` seconds (seeded: the same for both routings).  Every turn is one
``/v1/chat/completions`` request.

A later turn (2 and on) *hits* when ``usage.prompt_tokens_details.cached_tokens`` covers at least
the previous turn's whole prompt: the replica held the conversation.  Turn 1 can hit nothing.
Target: a hit share of at least 0.9 with prefix affinity (least-loaded gives about 0.5).

Prints one JSON object: per routing the hit share of the later turns, their mean latency, and the
mean cached tokens.
Run: .venv/bin/python bench/replica_routing.py [--conversations 8] [--turns 4] [--concurrency 2]
     [--think 2.0] [--seed 1]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.warm_turns import SMOLLM2, pool_service  # noqa: E402

QUESTIONS = ["What is on shelf 3?", "And on shelf 7?", "Which shelf holds maps?", "Is shelf 2 near the door?",
             "Who sorts shelf 9?", "Name one shelf with poems."]


def settings(prefix_affinity: bool) -> dict:
    definition = {"backend": "llama_cpp", "model_path": SMOLLM2, "enabled": True, "replicas": 2, "target_inflight": 1,
                  "gguf_n_ctx": 2048, "gguf_n_gpu_layers": 0, "gguf_n_threads": 1}
    return {"service": {"log_level": "warning"}, "models": {"smol": definition},
            "engine": {"routing": {"prefix_affinity": prefix_affinity}}}


def system_prompt(index: int) -> str:
    """A conversation's own system prompt: its first words differ, so another's cache holds little of it."""
    return f"Library {index * 7919 % 1000} assistant. Answer in a few words. " + " ".join(
        f"Shelf {i} of library {index} holds books on topic {(i * (index + 3)) % 17}." for i in range(1, 11)
    )


def conversation(http: httpx.Client, index: int, turns: int, think: list[float]) -> list[dict]:
    """One conversation's turns: prompt and cached tokens, latency, and whether it hit."""
    messages = [{"role": "system", "content": system_prompt(index)}]
    rows, previous_prompt = [], None
    for turn in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[(index + turn) % len(QUESTIONS)]})
        body = {"model": "smol", "messages": messages, "max_tokens": 8, "temperature": 0}
        began = time.perf_counter()
        response = http.post("/v1/chat/completions", json=body)
        elapsed = time.perf_counter() - began
        response.raise_for_status()
        answer = response.json()
        usage = answer["usage"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        rows.append({"turn": turn + 1, "prompt_tokens": usage["prompt_tokens"], "cached_tokens": cached,
                     "seconds": elapsed, "hit": previous_prompt is not None and cached >= previous_prompt})
        previous_prompt = usage["prompt_tokens"]
        messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
        time.sleep(think[turn])
    return rows


def measure(prefix_affinity: bool, args: argparse.Namespace) -> dict:
    pauses = random.Random(args.seed)
    think = [[pauses.uniform(0, args.think) for _ in range(args.turns)] for _ in range(args.conversations)]
    rows = []
    with pool_service(settings(prefix_affinity)) as url, httpx.Client(base_url=url, timeout=300) as http:
        for first in range(0, args.conversations, args.concurrency):
            wave = range(first, min(first + args.concurrency, args.conversations))
            with ThreadPoolExecutor(len(wave)) as pool:
                for turns in pool.map(lambda index: conversation(http, index, args.turns, think[index]), wave):
                    rows.extend(turns)
    later = [row for row in rows if row["turn"] > 1]
    return {
        "later_turns": len(later),
        "hit_share": round(sum(row["hit"] for row in later) / len(later), 3),
        "later_turn_mean_seconds": round(statistics.mean(row["seconds"] for row in later), 4),
        "later_turn_mean_cached_tokens": round(statistics.mean(row["cached_tokens"] for row in later), 1),
        "later_turn_mean_prompt_tokens": round(statistics.mean(row["prompt_tokens"] for row in later), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--think", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    results = {routing: measure(routing == "prefix_affinity", args) for routing in ("prefix_affinity", "least_loaded")}
    print(json.dumps({
        "bench": "replica_routing", "model": "SmolLM2-135M-Instruct Q4_1", "replicas": 2, "target_inflight": 1,
        "threads_per_replica": 1, "conversations": args.conversations, "turns": args.turns,
        "concurrency": args.concurrency, "think_seconds_max": args.think, "routing": results,
        "target_hit_share": 0.9,
    }, indent=2))


if __name__ == "__main__":
    main()
