"""The ct2 backend for real: a tiny CTranslate2 model built offline, loaded and run through the API."""
from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time

import pytest

from runtime.backends.ct2.engine import Ct2Engine, IncrementalDecoder, split_device
from runtime.backends.base import TextDelta
from runtime.service import RuntimeService
from tests.conftest import LiveService, write_settings
from tests.engines.runtime_driver import generation_request
from tests.engines.tiny_model import transformers_greedy

THINKING_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)
PROMPT = "Hello world, how are you today?"
MAX_TOKENS = 12


def ct2_definition(path, **fields) -> dict:
    return {"backend": "ct2", "model_path": str(path), "device": "cpu", "ct2_compute_type": "float32", **fields}


@pytest.fixture(scope="module")
def thinking_tokenizer(tiny_model, tmp_path_factory):
    """The tiny model's tokenizer files with a Qwen3-style template that honours enable_thinking."""
    folder = tmp_path_factory.mktemp("thinking-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny_model.ct2_path / name, folder / name)
    (folder / "chat_template.jinja").write_text(THINKING_TEMPLATE)
    return folder


@pytest.fixture(scope="module")
def service(tiny_model, thinking_tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ct2-service")
    models = {
        "tiny": ct2_definition(tiny_model.ct2_path, replica_max=2),
        "tiny-thinking": ct2_definition(
            tiny_model.ct2_path, prompt_format="qwen3_template", ct2_tokenizer_path=str(thinking_tokenizer)
        ),
        "tiny-missing": ct2_definition(folder / "no-such-model"),
    }
    live = LiveService(write_settings(folder, models), folder / "db.sqlite3").start()
    yield live
    assert live.stop() == 0


@pytest.fixture
def http(service):
    with service.client(timeout=60) as client:
        yield client


def respond(http, model: str, **fields):
    body = {"model": model, "input": PROMPT, "temperature": 0, "max_output_tokens": MAX_TOKENS, **fields}
    return http.post("/v1/responses", json=body)


def output_text(response: dict) -> str:
    return "".join(part["text"] for item in response["output"] for part in item["content"])


def stream_deltas(http, model: str) -> tuple[list[str], dict]:
    deltas, final = [], None
    body = {"model": model, "input": PROMPT, "temperature": 0, "max_output_tokens": MAX_TOKENS, "stream": True}
    with http.stream("POST", "/v1/responses", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line.removeprefix("data: "))
            if event["type"] == "response.output_text.delta":
                deltas.append(event["delta"])
            elif event["type"] in ("response.completed", "response.incomplete"):
                final = event["response"]
    return deltas, final


def test_load_generate_stream_and_unload_through_the_api(http, tiny_model):
    loaded = http.post("/v1/admin/models/tiny/load").json()
    assert (loaded["runtime_state"], loaded["last_error"], loaded["loaded_replicas"]) == ("loaded", None, 1)
    assert loaded["load_constraints"] == {} and loaded["load_override"] == {}
    assert loaded["vram_estimate_source"] in ("model_artifact_size", "observed_load_delta")

    expected = transformers_greedy(tiny_model, [{"role": "user", "content": PROMPT}], MAX_TOKENS)
    reply = respond(http, "tiny")
    assert reply.status_code == 200, reply.text
    result = reply.json()
    assert output_text(result) == expected.text != ""
    assert result["usage"]["input_tokens"] == len(expected.prompt_ids)
    assert result["usage"]["output_tokens"] == len(expected.output_ids)
    assert result["status"] == ("completed" if expected.stopped else "incomplete")

    deltas, final = stream_deltas(http, "tiny")
    # The model runs in an engine process, whose deltas coalesce while the reader lags: the tiny
    # model's whole answer may arrive as one delta, so only the text is exact here.
    assert deltas and "".join(deltas) == expected.text
    assert final["usage"] == result["usage"]

    unloaded = http.post("/v1/admin/models/tiny/unload").json()
    assert (unloaded["runtime_state"], unloaded["loaded_replicas"]) == ("unloaded", 0)
    refused = respond(http, "tiny")
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "model_not_loaded")


def test_two_replicas_answer_side_by_side(http):
    loaded = http.post("/v1/admin/models/tiny/load", json={"replicas": 2}).json()
    assert (loaded["runtime_state"], loaded["loaded_replicas"]) == ("loaded", 2)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        replies = list(pool.map(lambda _: respond(http, "tiny").json(), range(2)))
    assert output_text(replies[0]) == output_text(replies[1]) != ""
    assert http.post("/v1/admin/models/tiny/unload").json()["runtime_state"] == "unloaded"


def test_a_missing_model_fails_the_load_naming_the_path(http):
    failed = http.post("/v1/admin/models/tiny-missing/load").json()
    assert failed["runtime_state"] == "failed"
    assert "no-such-model" in failed["last_error"] and failed["last_error"].startswith("replica 1 of 1 failed")


def test_qwen3_thinking_switch_changes_the_rendered_prompt(http):
    assert http.post("/v1/admin/models/tiny-thinking/load").json()["runtime_state"] == "loaded"
    entry = next(m for m in http.get("/v1/admin/models").json()["models"] if m["name"] == "tiny-thinking")
    assert entry["capabilities"]["thinking_modes"] == ["default", "enabled", "disabled"]
    enabled = respond(http, "tiny-thinking", thinking="enabled").json()["usage"]["input_tokens"]
    disabled = respond(http, "tiny-thinking", thinking="disabled").json()["usage"]["input_tokens"]
    default = respond(http, "tiny-thinking").json()["usage"]["input_tokens"]
    assert disabled > enabled == default  # the empty think block is only rendered when disabled
    assert http.post("/v1/admin/models/tiny-thinking/unload").json()["runtime_state"] == "unloaded"


def test_thinking_is_refused_for_a_model_without_the_control(http):
    refused = respond(http, "tiny", thinking="enabled")
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "thinking_unsupported")


# ---- in-process ------------------------------------------------------------------------


def engine_config(tiny_model, **fields) -> dict:
    config = {
        "model_path": str(tiny_model.ct2_path),
        "device": "cpu",
        "ct2_compute_type": "float32",
        "ct2_inter_threads": 1,
        "ct2_intra_threads": 1,
        "ct2_max_batch_size": 0,
        "ct2_tokenizer_path": None,
        "enable_thinking": None,
    }
    config.update(fields)
    return config


async def test_closing_a_stream_stops_the_generation_thread(tiny_model):
    engine = Ct2Engine(engine_config(tiny_model), {"base_dir": "/"})
    await engine.load()
    stream = engine.generate(generation_request(PROMPT, max_output_tokens=400, temperature=0.0))
    first = await anext(stream)
    assert isinstance(first, TextDelta)
    started = time.monotonic()
    await stream.aclose()
    assert time.monotonic() - started < 5
    assert not engine._busy.locked()  # the worker thread has left the generator
    await engine.unload()
    assert engine._generator is None


async def test_unload_waits_for_a_generation_winding_down(tiny_model):
    engine = Ct2Engine(engine_config(tiny_model), {"base_dir": "/"})
    await engine.load()
    stream = engine.generate(generation_request(PROMPT, max_output_tokens=300, temperature=0.7))
    await anext(stream)
    closing = asyncio.create_task(stream.aclose())
    await engine.unload()
    await closing
    assert engine._generator is None


async def test_without_ctranslate2_the_load_fails_with_a_clear_error(tmp_path, tiny_model, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # in this process only: the engine runs here
    settings = write_settings(tmp_path, {"tiny": ct2_definition(tiny_model.ct2_path, isolation="none")})
    service = RuntimeService(str(settings))
    await service.start(load_enabled=False)
    entry = await service.handle("load", {"name": "tiny"}, None)
    assert entry["runtime_state"] == "failed"
    assert "CTranslate2 is not installed" in entry["last_error"]
    await service.shutdown()


def test_incremental_decoding_holds_back_split_utf8():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet), initial_alphabet=alphabet, show_progress=False)
    tokenizer.train_from_iterator(["plain ascii"], trainer)
    ids = tokenizer.encode("añb", add_special_tokens=False).ids
    assert len(ids) == 4  # "ñ" is two byte tokens
    decoder = IncrementalDecoder(tokenizer)
    assert [decoder.push(token_id) for token_id in ids] == ["a", "", "ñ", "b"]


def test_devices_split_into_name_and_index():
    assert split_device(None) == ("auto", 0)
    assert split_device("cpu") == ("cpu", 0)
    assert split_device("cuda:1") == ("cuda", 1)
