"""Raw text prompts (``GenerationRequest.prompt``) in the runtime: the ``raw_prompt`` capability of
every backend, admission (raw_prompt_unsupported first, no message checks), the fair-share
estimate, and the stub's deterministic raw answer."""
from __future__ import annotations

import pytest

from runtime.inference.admission import check_request, estimate_prompt_tokens
from runtime.backends import BACKENDS
from runtime.backends.base import Finished, TextDelta
from runtime.backends.stub.spec import StubEngine
from runtime.pool.catalog import CatalogEntry
from runtime.errors import InvalidRequest, RawPromptUnsupported
from runtime.inputs.request import ForwardedRequest, GenerationRequest

NATIVE = {"llama_cpp", "vllm", "exllamav3", "ct2", "stub"}
MINIMAL = {  # a valid definition of each backend
    "llama_cpp": {"model_path": "/models/m.gguf"},
    "llama_server": {"model_path": "/models/m.gguf"},
    "exllamav3": {"model_path": "/models/m-exl3"},
    "vllm": {"model_path": "/models/m"},
    "vllm_serve": {"vllm_serve_model": "google/gemma-4-26B-A4B-it"},
    "trtllm_serve": {"trtllm_serve_model": "google/gemma-4-26B-A4B-it"},
    "sglang_serve": {"sglang_serve_model": "google/gemma-4-26B-A4B-it"},
    "ct2": {"model_path": "/models/m-ct2"},
    "openai_remote": {"remote_base_url": "https://api.example.com/v1", "remote_model": "gpt-x"},
    "stub": {},
    "whisper": {"model_path": "/models/whisper-base"},
}
GENERATES_NOTHING = {"whisper"}  # speech to text: no prompt of any kind


def entry(**fields) -> CatalogEntry:
    model = BACKENDS["stub"].definition_model.model_validate({"backend": "stub", **fields})
    return CatalogEntry(name="m", definition=model, sources=("settings.json",), base_dir="/")


def raw(prompt: str = "Once upon a time", **fields) -> GenerationRequest:
    return GenerationRequest("r", [], prompt=prompt, **fields).resolved()


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_backend_says_whether_it_takes_a_raw_prompt(backend):
    spec = BACKENDS[backend]
    model = spec.definition_model.model_validate({"backend": backend, **MINIMAL[backend]})
    if backend in GENERATES_NOTHING:
        expected = False
    else:
        expected = True if backend in NATIVE else spec.forwards_requests(model)  # an upstream that gets the body runs it
    assert spec.capabilities(model)["raw_prompt"] is expected


def test_the_stub_declares_it_in_its_definition():
    assert entry().spec.capabilities(entry().definition)["raw_prompt"] is True
    assert entry().spec.capabilities(entry(raw_prompt=False).definition)["raw_prompt"] is False


def test_a_raw_prompt_skips_the_message_checks():
    check_request(entry(multi_turn=False), raw(), allow_remote=False)  # no messages, no user turn: fine
    with pytest.raises(InvalidRequest) as refused:  # the same request without a prompt has no user turn
        check_request(entry(), GenerationRequest("r", []).resolved(), allow_remote=False)
    assert refused.value.param == "input"


def test_a_model_without_raw_prompts_refuses_it_before_anything_else_it_records():
    request = ForwardedRequest(raw(), "/v1/completions", {"model": "m", "prompt": "Once upon a time", "echo": True},
                               typed_refusals=[InvalidRequest("echo is not supported", param="echo").to_dict()])
    with pytest.raises(RawPromptUnsupported) as refused:
        check_request(entry(raw_prompt=False), request, allow_remote=False)
    assert (refused.value.code, refused.value.http_status, refused.value.param) == ("raw_prompt_unsupported", 400, "prompt")
    with pytest.raises(InvalidRequest) as recorded:
        check_request(entry(), request, allow_remote=False)
    assert recorded.value.param == "echo"


def test_the_fair_share_estimate_counts_the_prompt():
    assert estimate_prompt_tokens(raw("x" * 40)) == 11
    assert estimate_prompt_tokens(raw("x" * 40, instructions="y" * 8)) == 13


async def collect(engine: StubEngine, request: GenerationRequest) -> tuple[list[str], Finished]:
    pieces, finished = [], None
    async for event in engine.generate(request):
        if isinstance(event, TextDelta):
            pieces.append(event.text)
        else:
            finished = event
    return pieces, finished


async def test_the_stubs_raw_answer_is_the_prompt_or_its_reply():
    config = entry().spec.effective_config(entry().definition, {})
    pieces, finished = await collect(StubEngine(config, 0), raw("Once upon a  time"))
    assert pieces == ["Once", " upon", " a", "  time"]
    assert (finished.input_tokens, finished.output_tokens, finished.finish_reason) == (4, 4, "stop")
    config = entry(stub_reply="fixed words here").spec.effective_config(entry(stub_reply="fixed words here").definition, {})
    pieces, finished = await collect(StubEngine(config, 0), raw("one two", max_output_tokens=2))
    assert pieces == ["fixed", " words"]
    assert (finished.input_tokens, finished.output_tokens, finished.finish_reason) == (2, 2, "length")
