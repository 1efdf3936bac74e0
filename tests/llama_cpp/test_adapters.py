"""LoRA adapters on the llama_cpp engine, for real: SmolLM2 with a rank-4 adapter built from
random tensors (lora_gguf).  At temperature 0 the adapter's answer differs from the base's and
at scale 0 it is the base's token for token; requests with different adapters running at once
answer each as it does alone (one adapter per batch); ``adapters_loaded`` drops and adds an
adapter back on the loaded weights; and the adapter's file is charged to its base."""
from __future__ import annotations

import asyncio
import dataclasses

import pytest
import pytest_asyncio
from llama_helpers import SMOLLM2_MODEL, answer_of
from lora_gguf import write_lora_gguf

from runtime.backends import BACKENDS
from runtime.backends.base import GenerationRequest
from runtime.backends.llama_cpp.engine import LlamaCppEngine
from runtime.errors import AdapterNotLoaded, InvalidLoadRequest

SPEC = BACKENDS["llama_cpp"]
QUESTION = "Name three colours of the sea."


@pytest.fixture(scope="module")
def adapter_files(tmp_path_factory, smollm2_gguf):
    folder = tmp_path_factory.mktemp("lora")
    write_lora_gguf(smollm2_gguf, folder / "sea.gguf")
    return folder


def definition(folder, **fields):
    adapters = {"sea": {"path": "sea.gguf"}, "quiet": {"path": "sea.gguf", "scale": 0.0}}
    return SPEC.definition_model.model_validate(
        {**SMOLLM2_MODEL, "gguf_n_ctx": 512, "gguf_flash_attn": "off", "target_inflight": 3, "adapters": adapters,
         **fields})


def make_engine(folder, overrides: dict | None = None) -> LlamaCppEngine:
    config = SPEC.effective_config(definition(folder), overrides or {})
    return SPEC.create_engine("m", config, 0, {"base_dir": str(folder), "state_dir": str(folder), "kv_store": None})


def ask(adapter: str | None, max_output_tokens: int = 12) -> GenerationRequest:
    request = GenerationRequest("r", [{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}],
                                max_output_tokens=max_output_tokens, temperature=0.0).resolved()
    return dataclasses.replace(request, adapter=adapter)


async def on_worker(engine: LlamaCppEngine, work, *args):
    return await asyncio.get_running_loop().run_in_executor(engine._worker, work, *args)


async def alone(engine: LlamaCppEngine, adapter: str | None) -> str:
    await on_worker(engine, engine.context.clear)
    text, _ = await answer_of(engine, ask(adapter))
    return text


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(adapter_files):
    engine = make_engine(adapter_files)
    await engine.load()
    yield engine
    await engine.unload()


pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_the_adapter_changes_the_answer_and_scale_zero_is_the_base(engine):
    base, adapted, quiet = [await alone(engine, adapter) for adapter in (None, "sea", "quiet")]
    assert base.strip() and adapted.strip()
    assert adapted != base, (base, adapted)
    assert quiet == base  # token for token


async def test_requests_with_different_adapters_at_once_answer_as_each_alone(engine):
    expected = [await alone(engine, adapter) for adapter in (None, "sea", None)]
    await on_worker(engine, engine.context.clear)
    answers = await asyncio.gather(*(answer_of(engine, ask(adapter)) for adapter in (None, "sea", None)))
    assert [text for text, _ in answers] == expected


async def test_a_sequence_an_adapter_filled_is_not_reused_by_the_base(engine):
    await on_worker(engine, engine.context.clear)
    await answer_of(engine, ask("sea"))
    text, finished = await answer_of(engine, ask(None))  # the same prompt: the adapter's cache holds it
    assert finished.cached_tokens == 0
    assert text == await alone(engine, None)


async def test_adapters_loaded_drops_and_adds_back_an_adapter_on_the_same_weights(adapter_files):
    engine = make_engine(adapter_files)
    await engine.load()
    try:
        weights = engine.weights
        adapted = await alone(engine, "sea")
        await engine.reconfigure(SPEC.effective_config(definition(adapter_files), {"adapters_loaded": ["quiet"]}))
        assert engine.lora.names == ["quiet"]
        with pytest.raises(AdapterNotLoaded):
            await answer_of(engine, ask("sea"))
        await engine.reconfigure(SPEC.effective_config(definition(adapter_files), {}))
        assert engine.lora.names == ["sea", "quiet"] and engine.weights is weights
        assert await alone(engine, "sea") == adapted
    finally:
        await engine.unload()


async def test_a_dropped_adapters_cache_stays_marked_and_is_not_reused_by_the_base(adapter_files):
    engine = make_engine(adapter_files)
    await engine.load()
    try:
        await on_worker(engine, engine.context.clear)
        await answer_of(engine, ask("sea"))  # one sequence now holds the adapter's cache of the prompt
        await engine.reconfigure(SPEC.effective_config(definition(adapter_files), {"adapters_loaded": ["quiet"]}))
        assert [seq for seq in range(engine.context.n_seq) if engine.lora.held(seq) is not None]  # marked: never saved as the base's
        text, finished = await answer_of(engine, ask(None))
        assert finished.cached_tokens == 0  # the dropped adapter's cache is not the base's
        assert text == await alone(engine, None)
    finally:
        await engine.unload()


async def test_a_reconfigure_whose_adapter_file_fails_changes_nothing(adapter_files, tmp_path):
    engine = make_engine(adapter_files)
    await engine.load()
    try:
        context, settings = engine.context, engine.context.settings
        broken = {**engine.config, "gguf_n_ctx": 256,
                  "adapters": {**engine.config["adapters"], "sea": {**engine.config["adapters"]["sea"],
                                                                     "path": str(tmp_path / "gone.gguf")}}}
        with pytest.raises(InvalidLoadRequest):
            await engine.reconfigure(broken)
        assert engine.context is context and engine.context.settings == settings
        assert engine.lora.names == ["sea", "quiet"]
        assert (await alone(engine, "sea")).strip()
    finally:
        await engine.unload()


async def test_adapters_loaded_names_declared_adapters_only(adapter_files):
    with pytest.raises(InvalidLoadRequest) as caught:
        SPEC.validate_overrides(definition(adapter_files), {"adapters_loaded": ["sea", "nope"]})
    assert caught.value.param == "adapters_loaded"


async def test_the_adapters_file_is_charged_to_its_base(adapter_files):
    from runtime.backends.shared.adapters import adapters_mib

    size_mib = -(-(adapter_files / "sea.gguf").stat().st_size // (1024 * 1024))
    config = SPEC.effective_config(definition(adapter_files), {})
    assert adapters_mib(config, str(adapter_files)) == 2 * size_mib  # declared twice, charged twice
    only_one = SPEC.effective_config(definition(adapter_files), {"adapters_loaded": ["sea"]})
    assert adapters_mib(only_one, str(adapter_files)) == size_mib
