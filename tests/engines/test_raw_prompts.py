"""Raw text prompts (``GenerationRequest.prompt``, POST /v1/completions) in the in-process engines:
vLLM and ExLlamaV3 against their recording fakes (the prompt reaches the tokenizer as it is, no
chat template), CTranslate2 for real on the tiny model (equal to transformers' greedy decoding of
the same raw prompt)."""
from __future__ import annotations

import itertools

import pytest

from runtime.backends.base import Finished, GenerationRequest, TextDelta
from runtime.backends.ct2.engine import Ct2Engine
from tests.engines.runtime_driver import load, without_timings

_ids = itertools.count()
RAW = "Once upon a time<|im_start|> the fox"


async def run_raw(service, model: str, prompt: str, **fields) -> tuple[dict, list[str]]:
    deltas: list[str] = []

    async def emit(event: dict) -> None:
        if event["event"] == "delta":
            deltas.append(event["text"])

    payload = {"request_id": f"raw-{next(_ids)}", "model": model, "messages": [], "prompt": prompt, **fields}
    return without_timings(await service.handle("generate", payload, emit)), deltas


async def test_vllm_tokenizes_the_raw_prompt_as_its_completions_endpoint(fake_vllm, runtime_service):
    service, _ = await runtime_service({"m": {
        "backend": "vllm", "model_path": "Qwen/Qwen3-8B", "prompt_format": "qwen3_template", "isolation": "none",
    }})
    assert (await load(service, "m"))["capabilities"]["raw_prompt"] is True
    result, deltas = await run_raw(service, "m", RAW, max_output_tokens=3, temperature=0.0, stream=True)
    assert fake_vllm.prompts == [RAW]  # no template around it
    assert fake_vllm.named("encode") == [{"add_special_tokens": True}]
    assert fake_vllm.named("generate")[0]["prompt"] == {"prompt_token_ids": [ord(c) for c in RAW]}
    assert deltas == ["Hello", " from", " a"]
    assert result == {"text": "Hello from a", "finish_reason": "length",
                      "usage": {"input_tokens": len(RAW), "output_tokens": 3}}


async def test_exllamav3_tokenizes_the_raw_prompt_with_bos(fake_exllamav3, runtime_service, tmp_path):
    folder = tmp_path / "exl3"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}", "eos_token": "<|im_end|>"}')
    service, _ = await runtime_service({"m": {"backend": "exllamav3", "model_path": str(folder), "isolation": "none"}})
    assert (await load(service, "m"))["capabilities"]["raw_prompt"] is True
    result, _ = await run_raw(service, "m", RAW, max_output_tokens=64)
    assert fake_exllamav3.prompts == [RAW]
    assert fake_exllamav3.named("Tokenizer.encode") == [{"add_bos": True, "encode_special_tokens": True}]
    assert result == {"text": "Hello from a fake", "finish_reason": "stop",
                      "usage": {"input_tokens": len(RAW), "output_tokens": 4}}


def transformers_raw_greedy(hf_path, prompt: str, max_new_tokens: int) -> tuple[int, str]:
    """(prompt token count, text) of transformers' greedy decoding of a raw prompt, tokenized with
    the tokenizer's own special-token rule, stopping at its eos token."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(hf_path)
    prompt_ids = tokenizer(prompt)["input_ids"]
    llama = LlamaForCausalLM.from_pretrained(hf_path)
    with torch.no_grad():
        output = llama.generate(
            torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        )
    return len(prompt_ids), tokenizer.decode(output[0][len(prompt_ids):].tolist(), skip_special_tokens=True)


@pytest.mark.parametrize("prompt", ["The quick brown fox", "<|im_start|>user\nHello world"])
async def test_ct2_runs_a_raw_prompt_as_transformers_does(tiny_model, prompt):
    config = {
        "model_path": str(tiny_model.ct2_path), "device": "cpu", "ct2_compute_type": "float32",
        "ct2_inter_threads": 1, "ct2_intra_threads": 1, "ct2_max_batch_size": 0, "ct2_tokenizer_path": None,
        "enable_thinking": None,
    }
    engine = Ct2Engine(config, {"base_dir": "/"})
    await engine.load()
    try:
        request = GenerationRequest("r", [], prompt=prompt, max_output_tokens=10, temperature=0.0).resolved()
        pieces, finished = [], None
        async for event in engine.generate(request):
            if isinstance(event, TextDelta):
                pieces.append(event.text)
            else:
                assert isinstance(event, Finished)
                finished = event
    finally:
        await engine.unload()
    prompt_tokens, text = transformers_raw_greedy(tiny_model.hf_path, prompt, 10)
    assert "".join(pieces) == text
    assert finished.input_tokens == prompt_tokens
