"""seed, presence/frequency/repeat penalties, top_k and logprobs reach each engine exactly as its
library takes them (the vLLM and ExLlamaV3 recording fakes check the exact arguments; ct2 for real
on the tiny model), only when the request sets them, and a model whose engine lacks one refuses it."""
from __future__ import annotations

import pytest

from runtime.errors import InvalidRequest
from tests.engines.engine_fakes import QWEN3_STYLE_TEMPLATE
from tests.engines.runtime_driver import generate, load

GEMMA = "google/gemma-4-26B-A4B-it"


def vllm_model(**fields) -> dict:
    return {"backend": "vllm", "model_path": GEMMA, "prompt_format": "gemma4_template", "isolation": "none", **fields}


async def test_vllm_gets_seed_penalties_and_logprobs_as_sampling_params(fake_vllm, runtime_service):
    service, _ = await runtime_service({"m": vllm_model()})
    await load(service, "m")
    result, _ = await generate(
        service, "m", max_output_tokens=8, temperature=0.5, top_p=0.9, seed=42, presence_penalty=0.5,
        frequency_penalty=-0.25, logprobs=1, top_k=5, repeat_penalty=1.3,
    )
    assert fake_vllm.named("SamplingParams")[-1] == {
        "max_tokens": 8, "temperature": 0.5, "top_p": 0.9, "seed": 42, "presence_penalty": 0.5,
        "frequency_penalty": -0.25, "logprobs": 1, "top_k": 5, "repetition_penalty": 1.3,
        "output_kind": fake_vllm.RequestOutputKind.DELTA,
    }
    assert result["logprobs"][0] == {
        "token": "Hello", "logprob": -0.25, "bytes": list(b"Hello"),
        "top_logprobs": [{"token": "Hello", "logprob": -0.25, "bytes": list(b"Hello")}],
    }
    assert [entry["token"] for entry in result["logprobs"]] == ["Hello", " from", " a", " fake"]

    await generate(service, "m", max_output_tokens=8, temperature=0.5, top_p=0.9)
    assert fake_vllm.named("SamplingParams")[-1] == {  # nothing the request left out
        "max_tokens": 8, "temperature": 0.5, "top_p": 0.9, "output_kind": fake_vllm.RequestOutputKind.DELTA,
    }
    chosen_only, _ = await generate(service, "m", logprobs=0)
    assert [entry["top_logprobs"] for entry in chosen_only["logprobs"]] == [[], [], [], []]


@pytest.fixture
def exl3_folder(tmp_path):
    import json

    folder = tmp_path / "qwen3-exl3"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": QWEN3_STYLE_TEMPLATE}))
    return folder


async def test_exllamav3_gets_the_seed_on_its_job_and_the_penalties_on_its_sampler(
    fake_exllamav3, runtime_service, exl3_folder
):
    definition = {"backend": "exllamav3", "model_path": str(exl3_folder), "prompt_format": "qwen3_template",
                  "isolation": "none"}
    service, _ = await runtime_service({"m": definition})
    await load(service, "m")
    await generate(service, "m", temperature=0.3, top_p=0.8, seed=7, presence_penalty=1.0, frequency_penalty=0.5,
                   repeat_penalty=1.2, top_k=4)
    assert fake_exllamav3.named("ComboSampler")[-1] == {
        "temperature": 0.3, "top_p": 0.8, "pres_p": 1.0, "freq_p": 0.5, "rep_p": 1.2, "top_k": 4}
    assert fake_exllamav3.named("Job")[-1]["seed"] == 7
    await generate(service, "m", temperature=0.3, top_p=0.8)
    assert fake_exllamav3.named("ComboSampler")[-1] == {"temperature": 0.3, "top_p": 0.8}
    assert "seed" not in fake_exllamav3.named("Job")[-1]
    with pytest.raises(InvalidRequest) as refused:  # ExLlamaV3's probabilities are after sampling: not offered
        await generate(service, "m", logprobs=0)
    assert refused.value.param == "logprobs"


def ct2_model(tiny_model) -> dict:
    return {"backend": "ct2", "model_path": str(tiny_model.ct2_path), "device": "cpu", "ct2_compute_type": "float32",
            "isolation": "none"}


@pytest.mark.parametrize("option", ["seed", "presence_penalty", "frequency_penalty", "logprobs"])
async def test_ct2_refuses_the_sampling_options_it_lacks(tiny_model, runtime_service, option):
    """No per-request seed in CTranslate2, and repetition_penalty is not OpenAI's penalty."""
    service, _ = await runtime_service({"m": ct2_model(tiny_model)})
    await load(service, "m")
    with pytest.raises(InvalidRequest) as refused:
        await generate(service, "m", **{option: 1})
    assert refused.value.param == option


async def test_ct2_samples_with_top_k_and_repeat_penalty(tiny_model, runtime_service):
    """top_k 1 is the greedy answer however hot the draw; a repeat penalty changes a greedy answer."""
    service, _ = await runtime_service({"m": ct2_model(tiny_model)})
    await load(service, "m")
    prompt = "Hello world, how are you today?"
    greedy, _ = await generate(service, "m", prompt, max_output_tokens=16, temperature=0.0)
    assert greedy["text"]
    hot = {"max_output_tokens": 16, "temperature": 2.0, "top_p": 1.0}
    drawn = {(await generate(service, "m", prompt, **hot))[0]["text"] for _ in range(2)}
    assert drawn - {greedy["text"]}
    for _ in range(2):
        assert (await generate(service, "m", prompt, top_k=1, **hot))[0]["text"] == greedy["text"]
    penalised, _ = await generate(service, "m", prompt, max_output_tokens=16, temperature=0.0, repeat_penalty=5.0)
    assert penalised["text"] != greedy["text"]
