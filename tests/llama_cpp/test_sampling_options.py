"""SmolLM2 for real through llama_cpp in its engine process: a seed makes sampling repeatable,
the presence, frequency and repeat penalties and top-k reach llama.cpp's sampler, logprobs come
back per token in the chat completions shape, and a GGUF whose chat template writes <think> tags is
split."""
from __future__ import annotations

import math

from llama_helpers import SMOLLM2_MODEL, write_metadata_only_gguf

from runtime.backends import BACKENDS
from runtime.backends.base import THINK_TAGS
from tests.engine_process.conftest import no_engine_process_left, state_dir  # noqa: F401 - fixtures
from tests.engines.runtime_driver import generate, load

PROMPT = "Write a short poem about the sea."
SAMPLED = {"temperature": 1.0, "top_p": 1.0, "max_output_tokens": 24}


async def test_the_same_seed_samples_the_same_text_and_other_seeds_reach_the_draw(runtime_service):
    service, _ = await runtime_service({"smol": SMOLLM2_MODEL})
    await load(service, "smol")
    first, _ = await generate(service, "smol", PROMPT, seed=1234, **SAMPLED)
    again, deltas = await generate(service, "smol", PROMPT, seed=1234, stream=True, **SAMPLED)
    assert first["text"] == again["text"] == "".join(deltas) and first["text"]
    # Different seeds: only the mechanics (some seed of five draws otherwise), not the texts themselves.
    texts = {(await generate(service, "smol", PROMPT, seed=seed, **SAMPLED))[0]["text"] for seed in (1, 2, 3, 4, -5)}
    assert len(texts | {first["text"]}) > 1


async def test_presence_and_frequency_penalties_reach_llama_cpp(runtime_service):
    service, _ = await runtime_service({"smol": SMOLLM2_MODEL})
    await load(service, "smol")
    greedy = {"temperature": 0.0, "max_output_tokens": 40}
    counting = "Count from 1 to 30, separated by commas."
    plain, _ = await generate(service, "smol", counting, **greedy)
    again, _ = await generate(service, "smol", counting, **greedy)
    assert plain["text"] == again["text"]  # greedy: the same without penalties
    for penalty in ({"presence_penalty": 2.0}, {"frequency_penalty": 2.0}):
        penalised, _ = await generate(service, "smol", counting, **greedy, **penalty)
        assert penalised["text"] != plain["text"], penalty  # the commas and digits repeat: penalised


async def test_top_k_and_repeat_penalty_reach_llama_cpp(runtime_service):
    service, _ = await runtime_service({"smol": SMOLLM2_MODEL})
    await load(service, "smol")
    greedy, _ = await generate(service, "smol", PROMPT, temperature=0.0, max_output_tokens=16)
    hot = {"temperature": 2.0, "top_p": 1.0, "max_output_tokens": 16}
    # Hot sampling draws other texts for other seeds; with top_k 1 every draw is the likeliest token.
    drawn = {(await generate(service, "smol", PROMPT, seed=seed, **hot))[0]["text"] for seed in (1, 2)}
    assert drawn - {greedy["text"]}
    for seed in (1, 2):
        assert (await generate(service, "smol", PROMPT, seed=seed, top_k=1, **hot))[0]["text"] == greedy["text"]
    counting = "Count from 1 to 30, separated by commas."
    plain, _ = await generate(service, "smol", counting, temperature=0.0, max_output_tokens=24)
    penalised, _ = await generate(service, "smol", counting, temperature=0.0, max_output_tokens=24, repeat_penalty=2.0)
    assert penalised["text"] != plain["text"]  # the commas and digits repeat: penalised


async def test_logprobs_per_token_with_the_top_alternatives(runtime_service):
    service, _ = await runtime_service({"smol": SMOLLM2_MODEL})
    await load(service, "smol")
    result, _ = await generate(service, "smol", "Say hello.", temperature=0.0, max_output_tokens=8, logprobs=3)
    entries = result["logprobs"]
    assert 1 <= len(entries) <= 8
    assert "".join(entry["token"] for entry in entries) == result["text"]
    for entry in entries:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["bytes"] == list(entry["token"].encode("utf-8")) and entry["logprob"] <= 0.0
        assert len(entry["top_logprobs"]) == 3
        ranked = [top["logprob"] for top in entry["top_logprobs"]]
        assert ranked == sorted(ranked, reverse=True) and math.fsum(math.exp(x) for x in ranked) <= 1.0 + 1e-4
        # greedy: the chosen token is the most likely one
        assert entry["top_logprobs"][0]["token"] == entry["token"]
        assert math.isclose(entry["top_logprobs"][0]["logprob"], entry["logprob"], abs_tol=1e-6)
    chosen_only, _ = await generate(service, "smol", "Say hello.", temperature=0.0, max_output_tokens=8, logprobs=0)
    assert [entry["top_logprobs"] for entry in chosen_only["logprobs"]] == [[] for _ in chosen_only["logprobs"]]


def test_a_gguf_whose_template_writes_think_tags_is_split(tmp_path):
    spec = BACKENDS["llama_cpp"]
    thinking = write_metadata_only_gguf(tmp_path / "thinking.gguf", "{{ '<think>' }}{{ '</think>' }}")
    plain = write_metadata_only_gguf(tmp_path / "plain.gguf", "{{ messages[0].content }}")

    def tags(path, **fields):
        definition = spec.definition_model.model_validate({"backend": "llama_cpp", "model_path": str(path), **fields})
        return spec.reasoning_tags(definition, str(tmp_path))

    assert tags(thinking) == THINK_TAGS
    assert tags(plain) is None
    assert tags(thinking, reasoning_tags=[]) is None  # the definition turns it off
    assert tags(plain, prompt_format="qwen3_template") == THINK_TAGS
