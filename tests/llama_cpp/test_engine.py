"""The llama_cpp engine in-process with real GGUF models: generation mechanics, failures, threads.

Assertions are about mechanics (token counts, finish reasons, streaming, timing), never the
exact text a model writes.
"""
from __future__ import annotations

import asyncio
import shutil
import time

import pytest
import pytest_asyncio
from llama_helpers import SMOLLM2_MODEL, write_metadata_only_gguf

from runtime.backends import BACKENDS
from runtime.backends.base import Finished, GenerationRequest, TextDelta
from runtime.backends.llama_cpp.engine import LlamaCppEngine
from runtime.backends.llama_cpp.native import EngineLoadError
from runtime.errors import ContextLengthExceeded, InvalidRequest

SPEC = BACKENDS["llama_cpp"]


def make_engine(base_dir, **fields) -> LlamaCppEngine:
    definition = SPEC.definition_model.model_validate({**SMOLLM2_MODEL, **fields})
    return SPEC.create_engine("m", SPEC.effective_config(definition, {}), 0, {"base_dir": str(base_dir)})


def ask(*turns: str, max_output_tokens: int = 8, temperature: float = 0.0, **fields) -> GenerationRequest:
    roles = ["user", "assistant"]
    messages = [
        {"role": roles[i % 2], "content": [{"type": "input_text", "text": text}]} for i, text in enumerate(turns)
    ]
    return GenerationRequest(
        "r", messages, max_output_tokens=max_output_tokens, temperature=temperature, **fields
    ).resolved()


async def collect(engine: LlamaCppEngine, request: GenerationRequest) -> tuple[list[str], Finished]:
    pieces, finished = [], None
    async for event in engine.generate(request):
        if isinstance(event, TextDelta):
            assert finished is None
            pieces.append(event.text)
        else:
            finished = event
    assert finished is not None
    return pieces, finished


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def smollm2(tmp_path_factory):
    engine = make_engine(tmp_path_factory.mktemp("smol"), gguf_n_ctx=256)
    await engine.load()
    yield engine
    await engine.unload()


pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_streams_tokens_and_counts_usage_with_the_model_tokenizer(smollm2):
    request = ask("What is the capital of France?", max_output_tokens=12)
    pieces, finished = await collect(smollm2, request)
    prompt_tokens = smollm2.weights.tokenize_prompt(smollm2.render(request))
    assert finished.input_tokens == len(prompt_tokens)
    assert finished.finish_reason in ("stop", "length")
    assert 0 < finished.output_tokens <= 12
    assert "".join(pieces).strip()
    if finished.finish_reason == "length":
        assert finished.output_tokens == 12


async def test_max_output_tokens_ends_with_length(smollm2):
    pieces, finished = await collect(smollm2, ask("Write a long story about a dragon.", max_output_tokens=3,
                                                  temperature=0.7))
    assert (finished.finish_reason, finished.output_tokens) == ("length", 3)
    assert 1 <= len(pieces) <= 3


async def test_a_prompt_longer_than_the_context_is_rejected_and_the_engine_keeps_working(smollm2):
    with pytest.raises(ContextLengthExceeded) as raised:
        await collect(smollm2, ask("word " * 400))
    assert raised.value.code == "context_length_exceeded" and raised.value.http_status == 400
    assert "256" in raised.value.message
    _, finished = await collect(smollm2, ask("Hi", max_output_tokens=2))
    assert finished.output_tokens > 0


async def test_a_full_context_cuts_the_reply_with_length(smollm2):
    # A prompt a few tokens short of the 256-token context leaves room for a few reply tokens.
    def prompt(n):
        return ask("Tell me a story. " * n, max_output_tokens=50)

    request = prompt(next(n for n in range(60, 0, -1) if len(smollm2.weights.tokenize_prompt(smollm2.render(prompt(n)))) <= 252))
    _, finished = await collect(smollm2, request)
    assert finished.finish_reason == "length"
    # The last sampled token needs no cache slot: input + output may exceed n_ctx by one.
    assert finished.output_tokens == 256 - finished.input_tokens + 1


async def test_closing_the_stream_stops_generation_and_frees_the_replica(smollm2):
    stream = smollm2.generate(ask("Tell me everything about the ocean.", max_output_tokens=200, temperature=0.7))
    await stream.__anext__()
    started = time.monotonic()
    await stream.aclose()
    # The worker is free again at once: the next request's first token is not behind 200 tokens.
    _, finished = await collect(smollm2, ask("Hi", max_output_tokens=1))
    assert finished.output_tokens == 1
    assert time.monotonic() - started < 3.0


async def test_the_event_loop_stays_responsive_while_generating(smollm2):
    lags = []

    async def ticker():
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.01)
            lags.append(time.monotonic() - before - 0.01)

    task = asyncio.create_task(ticker())
    await collect(smollm2, ask("Describe a forest in detail.", max_output_tokens=24, temperature=0.7))
    task.cancel()
    assert len(lags) > 10
    assert max(lags) < 0.25


async def test_translategemma_request_errors_come_before_any_work(tmp_path, gemma3_gguf):
    engine = make_engine(tmp_path, model_path=str(gemma3_gguf), prompt_format="translategemma_template")
    with pytest.raises(InvalidRequest) as raised:
        engine.render(ask("Hallo"))
    assert raised.value.param == "target_lang_code"


# ---- Gemma 3 base ----------------------------------------------------------------------------


@pytest.mark.parametrize("prompt_format", ["translategemma_template", "generic"])
async def test_gemma3_base_generates(tmp_path, gemma3_gguf, prompt_format):
    engine = make_engine(tmp_path, model_path=str(gemma3_gguf), prompt_format=prompt_format, gguf_n_ctx=512)
    await engine.load()
    try:
        request = ask("Guten Morgen, wie geht es dir?", max_output_tokens=6,
                      extra={"source_lang_code": "de", "target_lang_code": "en"})
        tokens = engine.weights.tokenize_prompt(engine.render(request))
        assert tokens[0] == engine.weights.bos and tokens[1] != engine.weights.bos  # exactly one BOS
        if prompt_format == "translategemma_template":
            turn = engine.weights.tokenize("<start_of_turn>", parse_special=True)
            assert len(turn) == 1 and turn[0] in tokens  # a real control token, not text
        pieces, finished = await collect(engine, request)
        assert finished.input_tokens == len(tokens)
        assert 0 < finished.output_tokens <= 6
    finally:
        await engine.unload()


# ---- load failures -----------------------------------------------------------------------------


async def expect_load_error(engine: LlamaCppEngine) -> str:
    with pytest.raises(EngineLoadError) as raised:
        await engine.load()
    assert engine.weights is None and engine.context is None  # nothing half-loaded stays behind
    await engine.unload()
    return str(raised.value)


async def test_a_missing_file_names_the_path(tmp_path):
    message = await expect_load_error(make_engine(tmp_path, model_path="models/absent.gguf"))
    assert str(tmp_path / "models" / "absent.gguf") in message


async def test_a_missing_package_is_named(tmp_path):
    message = await expect_load_error(make_engine(tmp_path, model_path="package:no_such_pkg_xyz/m.gguf"))
    assert "no_such_pkg_xyz" in message and "not installed" in message


async def test_relative_paths_resolve_against_the_settings_folder(tmp_path, smollm2_gguf):
    (tmp_path / "models").mkdir()
    shutil.copy(smollm2_gguf, tmp_path / "models" / "smol.gguf")
    engine = make_engine(tmp_path, model_path="models/smol.gguf", gguf_n_ctx=64)
    await engine.load()
    try:
        assert engine.weights.path == str(tmp_path / "models" / "smol.gguf")
    finally:
        await engine.unload()


async def test_a_file_that_is_not_gguf_fails_the_load(tmp_path):
    (tmp_path / "weights.gguf").write_bytes(b"\0" * 4096)
    message = await expect_load_error(make_engine(tmp_path, model_path="weights.gguf"))
    assert "not a GGUF file" in message


async def test_a_gguf_without_tensors_fails_in_llama_cpp_with_its_reason(tmp_path):
    write_metadata_only_gguf(tmp_path / "empty.gguf", "{{ messages[0]['content'] }}")
    message = await expect_load_error(make_engine(tmp_path, model_path="empty.gguf"))
    assert message.startswith(f"llama.cpp could not load {tmp_path / 'empty.gguf'}")


async def test_an_engine_rejected_cache_combination_is_a_clear_failed_load(tmp_path):
    engine = make_engine(tmp_path, gguf_flash_attn="off", gguf_type_k="q8_0", gguf_type_v="q8_0", gguf_n_ctx=64)
    message = await expect_load_error(engine)
    assert "rejected the context settings" in message
    assert "flash_attn" in message and "type_v=q8_0" in message


async def test_gguf_template_needs_a_template_in_the_file(tmp_path):
    write_metadata_only_gguf(tmp_path / "plain.gguf", None)
    message = await expect_load_error(make_engine(tmp_path, model_path="plain.gguf"))
    assert "carries no chat template" in message


async def test_a_malicious_gguf_template_is_refused_by_the_sandbox(tmp_path):
    marker = tmp_path / "pwned"
    template = (
        "{{ cycler.__init__.__globals__.os.popen('touch " + str(marker) + "').read() }}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    write_metadata_only_gguf(tmp_path / "evil.gguf", template)
    message = await expect_load_error(make_engine(tmp_path, model_path="evil.gguf"))
    assert "refused by the sandbox" in message
    assert not marker.exists()
