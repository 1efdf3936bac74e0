"""A raw text prompt (``GenerationRequest.prompt``, POST /v1/completions) in the llama_cpp engine:
tokenized and run as llama-cpp-python's own ``Llama.create_completion`` runs it, so at temperature
0 the two write the same tokens for SmolLM2; the chat template is not applied."""
from __future__ import annotations

import pytest
from llama_helpers import SMOLLM2_MODEL

from runtime.backends import BACKENDS
from runtime.backends.base import Finished, GenerationRequest, TextDelta

SPEC = BACKENDS["llama_cpp"]
PROMPTS = ["The capital of France is", "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n"]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def reference(smollm2_gguf):
    """llama-cpp-python's high-level completion of each prompt at temperature 0."""
    import llama_cpp

    llama = llama_cpp.Llama(str(smollm2_gguf), n_ctx=256, n_threads=1, n_gpu_layers=0, verbose=False)
    try:
        answers = {}
        for prompt in PROMPTS:
            answer = llama.create_completion(prompt, max_tokens=MAX_TOKENS, temperature=0.0)
            answers[prompt] = (answer["choices"][0]["text"], answer["usage"])
        return answers
    finally:
        llama.close()


@pytest.mark.parametrize("prompt", PROMPTS)
async def test_a_raw_prompt_runs_as_llama_cpp_pythons_completion(tmp_path, reference, prompt):
    definition = SPEC.definition_model.model_validate({**SMOLLM2_MODEL, "gguf_n_ctx": 256})
    assert SPEC.capabilities(definition)["raw_prompt"] is True
    engine = SPEC.create_engine("m", SPEC.effective_config(definition, {}), 0, {"base_dir": str(tmp_path)})
    await engine.load()
    try:
        request = GenerationRequest("r", [], prompt=prompt, max_output_tokens=MAX_TOKENS, temperature=0.0).resolved()
        pieces, finished = [], None
        async for event in engine.generate(request):
            if isinstance(event, TextDelta):
                pieces.append(event.text)
            else:
                assert isinstance(event, Finished)
                finished = event
    finally:
        await engine.unload()
    text, usage = reference[prompt]
    assert "".join(pieces) == text
    assert finished.input_tokens == usage["prompt_tokens"]
    assert finished.output_tokens >= usage["completion_tokens"]  # ours counts an end-of-generation token too
