"""The ExLlamaV3 engine against a recording fake of the exllamav3 package."""
from __future__ import annotations

import asyncio
import json
import sys

import pytest

from runtime.errors import InvalidLoadRequest, LoadBodyInvalid
from tests.engine_process.conftest import engine_processes
from tests.engines.engine_fakes import QWEN3_STYLE_TEMPLATE, fakes_in_engine_processes, recorded_calls
from tests.engines.runtime_driver import assert_refused_unchanged, generate, generation_request, load, unload
from tests.runtime.helpers import LOAD_CYCLE, UNLOAD_CYCLE, moves

# The spec's four ExLlamaV3 example load bodies and the cache each must build.
SPEC_EXAMPLES = [
    (
        {"exllama_cache_size": 32768, "exllama_cache_quant": None, "exllama_max_rq_tokens": 32768},
        {"max_num_tokens": 32768, "layer_type": "CacheLayer_fp16"},
    ),
    (
        {"exllama_cache_size": 32768, "exllama_cache_quant": "8,8", "exllama_max_rq_tokens": 32768},
        {"max_num_tokens": 32768, "layer_type": "CacheLayer_quant", "k_bits": 8, "v_bits": 8},
    ),
    (
        {"exllama_cache_size": 32768, "exllama_cache_quant": "8,4", "exllama_max_rq_tokens": 32768},
        {"max_num_tokens": 32768, "layer_type": "CacheLayer_quant", "k_bits": 8, "v_bits": 4},
    ),
    (
        {
            "exllama_cache_size": 32768,
            "exllama_cache_k_bits": 8,
            "exllama_cache_v_bits": 4,
            "exllama_max_rq_tokens": 32768,
        },
        {"max_num_tokens": 32768, "layer_type": "CacheLayer_quant", "k_bits": 8, "v_bits": 4},
    ),
]


@pytest.fixture
def model_folder(tmp_path):
    """An EXL3 model folder as far as llm-pool reads it: the tokenizer config with its chat template."""
    folder = tmp_path / "qwen3-exl3"
    folder.mkdir()
    config = {"chat_template": QWEN3_STYLE_TEMPLATE, "bos_token": None, "eos_token": "<|im_end|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def exllama(folder, **fields) -> dict:
    """The recording fake lives in this process's sys.modules, so the engine runs here too (isolation none)."""
    return {"backend": "exllamav3", "model_path": str(folder), "prompt_format": "qwen3_template",
            "isolation": "none", **fields}


def cache_calls(recorder) -> list[dict]:
    """The Cache keyword arguments, with the layer class by name."""
    return [{**call, "layer_type": call["layer_type"].__name__} for call in recorder.named("Cache")]


@pytest.mark.parametrize("body, cache", SPEC_EXAMPLES)
async def test_spec_example_bodies_build_the_exact_engine(fake_exllamav3, runtime_service, model_folder, body, cache):
    service, _ = await runtime_service({"m": exllama(model_folder, exllama_cache_quant="6")})
    entry = await load(service, "m", body)
    assert (entry["runtime_state"], entry["last_error"]) == ("loaded", None)
    assert entry["load_override"] == body
    assert fake_exllamav3.named("Config.from_directory") == [{"directory": str(model_folder)}]
    assert cache_calls(fake_exllamav3) == [cache]
    assert fake_exllamav3.named("Model.load") == [{"use_per_device": None, "tensor_p": False, "progressbar": False}]
    assert fake_exllamav3.named("Generator") == [{"model": "Model", "cache": "Cache", "tokenizer": "Tokenizer"}]
    await generate(service, "m", max_output_tokens=100)
    assert fake_exllamav3.named("Job")[-1]["max_rq_tokens"] == 32768


async def test_the_definition_drives_the_engine_without_a_load_body(fake_exllamav3, runtime_service, model_folder):
    definition = exllama(
        model_folder, exllama_cache_size=4096, exllama_cache_quant="6", exllama_gpu_split=[20.5, 24.0],
        exllama_tensor_parallel=True, exllama_max_rq_tokens=512,
    )
    service, _ = await runtime_service({"m": definition})
    await load(service, "m")
    assert cache_calls(fake_exllamav3) == [
        {"max_num_tokens": 4096, "layer_type": "CacheLayer_quant", "k_bits": 6, "v_bits": 6}
    ]
    assert fake_exllamav3.named("Model.load") == [
        {"use_per_device": [20.5, 24.0], "tensor_p": True, "progressbar": False}
    ]
    assert fake_exllamav3.names()[:6] == [
        "Config.from_directory", "Model.from_config", "Cache", "Model.load", "Tokenizer.from_config", "Generator"
    ]


async def test_null_bits_in_a_load_body_mean_an_fp16_cache(fake_exllamav3, runtime_service, model_folder):
    service, _ = await runtime_service({"m": exllama(model_folder, exllama_cache_quant="8,8")})
    entry = await load(service, "m", {"exllama_cache_k_bits": None, "exllama_cache_v_bits": None})
    assert entry["load_override"] == {"exllama_cache_k_bits": None, "exllama_cache_v_bits": None}
    assert cache_calls(fake_exllamav3) == [{"max_num_tokens": 8192, "layer_type": "CacheLayer_fp16"}]


@pytest.mark.parametrize(
    "body, error, param",
    [
        ({"exllama_cache_size": 8000}, InvalidLoadRequest, "exllama_cache_size"),
        ({"exllama_cache_quant": "fp16"}, InvalidLoadRequest, "exllama_cache_quant"),
        ({"exllama_cache_quant": "9"}, InvalidLoadRequest, "exllama_cache_quant"),
        ({"exllama_cache_k_bits": 8}, InvalidLoadRequest, "exllama_cache_v_bits"),
        ({"exllama_cache_k_bits": 8, "exllama_cache_v_bits": None}, InvalidLoadRequest, "exllama_cache_k_bits"),
        (
            {"exllama_cache_quant": "8", "exllama_cache_k_bits": 8, "exllama_cache_v_bits": 8},
            InvalidLoadRequest,
            "exllama_cache_quant",
        ),
        ({"exllama_cache_k_bits": 1, "exllama_cache_v_bits": 4}, InvalidLoadRequest, "exllama_cache_k_bits"),
        ({"vllm_max_model_len": 4096}, InvalidLoadRequest, "vllm_max_model_len"),
        ({"exllama_cache_size": 0}, LoadBodyInvalid, None),
        ({"exllama_max_rq_tokens": 0}, LoadBodyInvalid, None),
    ],
)
async def test_bad_load_bodies_are_refused_without_a_state_change(
    fake_exllamav3, runtime_service, model_folder, body, error, param
):
    service, events = await runtime_service({"m": exllama(model_folder)})
    await assert_refused_unchanged(service, events, body, error, param, fake_exllamav3)


async def test_lifecycle_generation_and_release(fake_exllamav3, runtime_service, model_folder):
    service, events = await runtime_service({"m": exllama(model_folder, exllama_max_rq_tokens=1024)})
    await load(service, "m")
    result, deltas = await generate(service, "m", "Hi", max_output_tokens=64, temperature=0.3, top_p=0.8, stream=True)
    prompt = fake_exllamav3.prompts[-1]
    assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert deltas == ["Hello", " from", " a", " fake"]
    assert result == {"text": "Hello from a fake", "finish_reason": "stop", "usage": {"input_tokens": len(prompt), "output_tokens": 4}}
    assert fake_exllamav3.named("Tokenizer.encode") == [{"add_bos": False, "encode_special_tokens": True}]
    assert fake_exllamav3.named("ComboSampler") == [{"temperature": 0.3, "top_p": 0.8}]
    job = fake_exllamav3.named("Job")[-1]
    assert job == {"max_new_tokens": 64, "stop_conditions": [2, 7], "max_rq_tokens": 1024, "identifier": job["identifier"]}

    short, _ = await generate(service, "m", max_output_tokens=3)
    assert (short["text"], short["finish_reason"], short["usage"]["output_tokens"]) == ("Hello from a", "length", 3)

    await unload(service, "m")
    assert fake_exllamav3.names()[-1] == "Model.unload"
    assert moves(events, "m") == LOAD_CYCLE + UNLOAD_CYCLE


async def test_thinking_modes_render_the_template_switch(fake_exllamav3, runtime_service, model_folder):
    service, _ = await runtime_service({"m": exllama(model_folder, enable_thinking=True)})
    entry = await load(service, "m")
    assert entry["capabilities"]["thinking_modes"] == ["default", "enabled", "disabled"]
    for thinking in ("disabled", "enabled", "default"):
        await generate(service, "m", "Why?", thinking=thinking)
    head = "<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n"
    assert fake_exllamav3.prompts == [head + "<think>\n\n</think>\n\n", head, head]


async def test_leaving_a_stream_cancels_the_job(fake_exllamav3, model_folder):
    from runtime.backends import BACKENDS

    fake_exllamav3.step_seconds = 0.05
    fake_exllamav3.reply = [f" w{i}" for i in range(40)]
    spec = BACKENDS["exllamav3"]
    definition = spec.definition_model.model_validate(exllama(model_folder))
    engine = spec.create_engine("m", spec.effective_config(definition, {}), 0, {"base_dir": "/"})
    await engine.load()
    stream = engine.generate(generation_request(max_output_tokens=40))
    assert (await anext(stream)).text == " w0"
    await stream.aclose()
    assert fake_exllamav3.names()[-1] == "Generator.cancel"
    assert not engine._busy.locked()
    await engine.unload()


async def test_a_failed_model_load_releases_the_weights(fake_exllamav3, runtime_service, model_folder):
    fake_exllamav3.fail_load = "CUDA out of memory"
    service, _ = await runtime_service({"m": exllama(model_folder)})
    entry = await load(service, "m")
    # An out-of-memory failure names the device it was placed on (runtime.pool.memory raises its estimate).
    assert entry["last_error"] == (
        f"out of memory on {entry['placement'][0]}: replica 1 of 1 failed to load: CUDA out of memory"
    )
    assert fake_exllamav3.names()[-2:] == ["Model.load", "Model.unload"]


async def test_a_missing_model_folder_is_named(fake_exllamav3, runtime_service, tmp_path):
    service, _ = await runtime_service({"m": exllama(tmp_path / "nowhere")})
    entry = await load(service, "m")
    assert entry["last_error"] == f"replica 1 of 1 failed to load: the model folder {tmp_path / 'nowhere'} does not exist"
    assert fake_exllamav3.calls == []


async def test_without_exllamav3_the_load_fails_with_a_clear_error(monkeypatch, runtime_service, model_folder):
    monkeypatch.setitem(sys.modules, "exllamav3", None)
    service, _ = await runtime_service({"m": exllama(model_folder)})
    entry = await load(service, "m")
    assert entry["runtime_state"] == "failed"
    assert entry["last_error"].startswith("replica 1 of 1 failed to load: ExLlamaV3 is not installed")


async def test_in_an_engine_process_without_exllamav3_the_load_fails_with_the_same_error(runtime_service, model_folder):
    """ExLlamaV3 is not installed in the test environment: the engine process reports what the runtime would."""
    service, _ = await runtime_service({"m": exllama(model_folder, isolation="process")})
    entry = await load(service, "m")
    assert entry["runtime_state"] == "failed"
    assert entry["last_error"].startswith("replica 1 of 1 failed to load: ExLlamaV3 is not installed")


async def test_the_engine_runs_in_an_engine_process_with_the_same_arguments(
    runtime_service, model_folder, tmp_path, monkeypatch
):
    """The fake as a package the engine process imports; its calls come back through a file."""
    records = tmp_path / "exllamav3-calls.jsonl"
    fakes_in_engine_processes(monkeypatch, records)
    service, events = await runtime_service({"m": exllama(model_folder, isolation="process", exllama_max_rq_tokens=1024)})
    entry = await load(service, "m", {"exllama_cache_size": 4096})
    assert (entry["runtime_state"], entry["last_error"]) == ("loaded", None)
    [engine] = service.pool.controller("m").engines
    assert engine.process.pid in [p.pid for p in engine_processes()]
    result, deltas = await generate(service, "m", "Hi", max_output_tokens=64, stream=True)
    assert "".join(deltas) == result["text"] == "Hello from a fake"  # deltas coalesce on the way
    await unload(service, "m")
    calls = recorded_calls(records)
    assert [arguments for name, arguments in calls if name == "Cache"] == [
        {"max_num_tokens": 4096, "layer_type": "CacheLayer_fp16"}
    ]
    assert [arguments["max_rq_tokens"] for name, arguments in calls if name == "Job"] == [1024]
    assert [name for name, _ in calls][-1] == "Model.unload"
    assert moves(events, "m") == LOAD_CYCLE + UNLOAD_CYCLE
    assert engine_processes() == []


async def test_two_replicas_are_two_engines(fake_exllamav3, runtime_service, model_folder):
    service, _ = await runtime_service({"m": exllama(model_folder, replicas=2)})
    await load(service, "m")
    results = await asyncio.gather(generate(service, "m"), generate(service, "m"))
    assert [r["text"] for r, _ in results] == ["Hello from a fake"] * 2
    assert len(fake_exllamav3.named("Generator")) == 2
    await unload(service, "m")
    assert fake_exllamav3.names().count("Model.unload") == 2


async def test_a_job_the_generator_drops_fails_the_request(fake_exllamav3, runtime_service, model_folder):
    from runtime.errors import BackendError

    fake_exllamav3.reply = []  # the fake then yields "started" and forgets the job
    service, _ = await runtime_service({"m": exllama(model_folder)})
    await load(service, "m")
    with pytest.raises(BackendError, match="dropped the job without a result"):
        await generate(service, "m")
    assert (await service.handle("get_model", {"name": "m"}, None))["runtime_state"] == "loaded"
