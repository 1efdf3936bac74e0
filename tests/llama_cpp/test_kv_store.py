"""Saved KV caches, for real (SmolLM2 and Gemma 3 270M): a conversation's cache survives an
unload or a sleep, is restored only for the same model file and KV settings, and a damaged file
is dropped with a warning while the request prefills as usual.

Each test runs its engines against its own state folder; ``min_tokens`` is small so short
conversations are saved.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path

import pytest
from llama_helpers import SMOLLM2_MODEL, answer_of

from runtime.backends import BACKENDS
from runtime.backends.base import Finished, GenerationRequest
from runtime.backends.llama_cpp.engine import LlamaCppEngine
from runtime.backends.llama_cpp.kv_store import MAGIC, KvStore, common_prefix
from runtime.config import KvStoreSettings

SPEC = BACKENDS["llama_cpp"]
SYSTEM = "You keep the logbook of a ship's engine room and answer in one short sentence. " + " ".join(
    f"Gauge {i} is read every {i + 2} hours." for i in range(1, 21)
)
KV = {"enabled": True, "max_mib": 256, "max_model_mib": 128, "min_tokens": 16}


def definition(model: str, gemma3_gguf) -> dict:
    if model == "smollm2":
        return {**SMOLLM2_MODEL, "gguf_n_ctx": 1024}
    return {"backend": "llama_cpp", "model_path": str(gemma3_gguf), "prompt_format": "generic",
            "gguf_n_ctx": 1024, "gguf_n_gpu_layers": 0, "gguf_n_threads": 1}


def make_engine(fields: dict, state: Path, kv: dict | None = None) -> LlamaCppEngine:
    config = SPEC.effective_config(SPEC.definition_model.model_validate(fields), {})
    return SPEC.create_engine("m", config, 0, {"base_dir": str(state), "state_dir": str(state),
                                               "kv_store": KV if kv is None else kv})


def turn(*history: str) -> GenerationRequest:
    roles = ["user", "assistant"]
    messages = [{"role": roles[i % 2], "content": [{"type": "input_text", "text": text}]}
                for i, text in enumerate(history)]
    return GenerationRequest("r", messages, instructions=SYSTEM, max_output_tokens=16, temperature=0.0).resolved()


async def on_worker(engine: LlamaCppEngine, work, *args):
    return await asyncio.get_running_loop().run_in_executor(engine._worker, work, *args)


def saved(state: Path) -> list[Path]:
    return sorted((state / "kv").glob("*/*.kv"))


async def first_turn_saved(fields: dict, state: Path) -> tuple[str, list[int]]:
    """Turn 1 on an engine that then unloads (saving its cache): the answer and the tokens saved."""
    engine = make_engine(fields, state)
    await engine.load()
    try:
        answer, _ = await answer_of(engine, turn("How often is gauge 3 read?"))
        held = list(engine.context.tokens)
    finally:
        await engine.unload()
    assert len(saved(state)) == 1
    return answer, held


async def cold_answer(engine: LlamaCppEngine, request: GenerationRequest) -> tuple[str, Finished]:
    store, engine.kv_store = engine.kv_store, None
    try:
        await on_worker(engine, engine.context.clear)
        return await answer_of(engine, request)
    finally:
        engine.kv_store = store


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
async def test_a_conversation_comes_back_after_an_unload_and_answers_as_a_cold_prefill(tmp_path, gemma3_gguf, model):
    fields = definition(model, gemma3_gguf)
    answer, held = await first_turn_saved(fields, tmp_path)
    engine = make_engine(fields, tmp_path)
    await engine.load()
    try:
        request = turn("How often is gauge 3 read?", answer, "And gauge 12?")
        tokens = engine.weights.tokenize_prompt(engine.render(request))
        text, finished = await answer_of(engine, request)
        assert finished.cached_tokens == common_prefix(held, tokens) > 100  # restored from the file, not decoded
        cold_text, cold = await cold_answer(engine, request)
        assert cold.cached_tokens == 0
        assert (text, finished.output_tokens) == (cold_text, cold.output_tokens)
    finally:
        await engine.unload()


async def test_sleep_saves_and_the_woken_context_restores(tmp_path):
    engine = make_engine(SMOLLM2_MODEL, tmp_path)
    await engine.load()
    try:
        request = turn("How often is gauge 3 read?")
        expected, _ = await answer_of(engine, request)
        await engine.sleep()
        assert len(saved(tmp_path)) == 1
        await engine.wake()
        text, finished = await answer_of(engine, request)
        assert finished.cached_tokens == finished.input_tokens - 1
        assert text == expected
    finally:
        await engine.unload()


@pytest.mark.parametrize("change", [{"gguf_n_ctx": 1536}, {"gguf_type_k": "q8_0"}, {"gguf_flash_attn": "on"}])
async def test_a_cache_saved_under_other_kv_settings_is_never_restored(tmp_path, change):
    await first_turn_saved(SMOLLM2_MODEL, tmp_path)
    engine = make_engine({**SMOLLM2_MODEL, **change}, tmp_path)
    await engine.load()
    try:
        _, finished = await answer_of(engine, turn("How often is gauge 3 read?"))
        assert finished.cached_tokens == 0
    finally:
        await engine.unload()
    assert len({path.parent for path in saved(tmp_path)}) == 2  # each identity its own folder, the first kept


async def test_a_cache_saved_for_a_changed_model_file_is_never_restored(tmp_path, smollm2_gguf):
    copy = tmp_path / "smol.gguf"
    shutil.copy(smollm2_gguf, copy)
    fields = {**SMOLLM2_MODEL, "model_path": str(copy)}
    await first_turn_saved(fields, tmp_path)
    os.utime(copy, ns=(copy.stat().st_atime_ns, copy.stat().st_mtime_ns + 10**9))  # the file was replaced
    engine = make_engine(fields, tmp_path)
    await engine.load()
    try:
        _, finished = await answer_of(engine, turn("How often is gauge 3 read?"))
        assert finished.cached_tokens == 0
    finally:
        await engine.unload()


def corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1000] ^= 0xFF  # inside the KV state
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-4096])


def foreign(path: Path) -> None:
    """The file of another identity, put in this identity's folder."""
    data = path.read_bytes()
    assert b'"n_ctx":2048' in data
    path.write_bytes(data.replace(b'"n_ctx":2048', b'"n_ctx":2049', 1))


def not_a_kv_file(path: Path) -> None:
    path.write_bytes(b"GGUF" + path.read_bytes()[len(MAGIC):])


@pytest.mark.parametrize("damage", [corrupt, truncate, foreign, not_a_kv_file])
async def test_a_damaged_file_is_dropped_with_a_warning_and_the_request_prefills(tmp_path, caplog, damage):
    answer, _ = await first_turn_saved(SMOLLM2_MODEL, tmp_path)
    [path] = saved(tmp_path)
    damage(path)
    engine = make_engine(SMOLLM2_MODEL, tmp_path)
    try:
        with caplog.at_level(logging.WARNING, logger="llmpool.llama_cpp"):
            await engine.load()  # damaged headers are found here, damaged states at the restore
            text, finished = await answer_of(engine, turn("How often is gauge 3 read?"))
        assert finished.cached_tokens == 0 and text == answer
        assert not path.exists()
        assert any("dropped the saved KV cache" in record.getMessage() for record in caplog.records)
    finally:
        await engine.unload()


async def test_a_conversation_shorter_than_min_tokens_is_not_saved(tmp_path):
    engine = make_engine(SMOLLM2_MODEL, tmp_path, kv={**KV, "min_tokens": 1000})
    await engine.load()
    _, finished = await answer_of(engine, turn("How often is gauge 3 read?"))
    await engine.unload()
    assert finished.input_tokens < 1000 and saved(tmp_path) == []
    assert not (tmp_path / "kv").exists()  # no folder either: the first save makes it


async def test_off_saves_nothing(tmp_path):
    engine = make_engine(SMOLLM2_MODEL, tmp_path, kv={**KV, "enabled": False})
    await engine.load()
    await answer_of(engine, turn("How often is gauge 3 read?"))
    await engine.unload()
    assert not (tmp_path / "kv").exists()


async def test_the_disk_budgets_hold_over_a_hundred_conversations(tmp_path):
    engine = make_engine(SMOLLM2_MODEL, tmp_path, kv={**KV, "max_model_mib": 4, "max_mib": 6, "min_tokens": 8})
    await engine.load()
    other = KvStore(tmp_path / "kv", {**engine.kv_store.identity, "n_ctx": 4096},
                    max_bytes=6 * 2**20, max_model_bytes=4 * 2**20, min_tokens=8)

    def conversations() -> list[Path]:
        written = []
        for index in range(100):
            tokens = [engine.weights.bos] + engine.weights.tokenize(f"Conversation {index}: gauge {index} reads "
                                                                    f"{index * 7} bar at noon.", parse_special=False)
            engine.context.clear()
            engine.context.decode(tokens)
            store = engine.kv_store if index % 3 else other  # two identities share the whole budget
            written.append(store.save(engine.context))
            assert sum(path.stat().st_size for path in store.folder.glob("*.kv")) <= 4 * 2**20
            assert sum(path.stat().st_size for path in saved(tmp_path)) <= 6 * 2**20
        return written

    try:
        written = await on_worker(engine, conversations)
    finally:
        await engine.unload()
    assert all(written)
    left = saved(tmp_path)
    assert 2 < len(left) < 100 and written[-1] in left and written[0] not in left  # the oldest went first
    assert not [path for path in (tmp_path / "kv").rglob("*") if path.is_file() and path.suffix != ".kv"]


def test_the_settings_section_defaults_on_with_bounded_budgets():
    settings = KvStoreSettings()
    assert (settings.enabled, settings.max_mib, settings.max_model_mib, settings.min_tokens) == (True, 4096, 1024, 256)
    with pytest.raises(ValueError):
        KvStoreSettings(max_mib=-1)
