"""The in-process vLLM engine against a recording fake of vLLM's AsyncLLM / AsyncEngineArgs."""
from __future__ import annotations

import asyncio
import sys

import pytest

from runtime.errors import InvalidLoadRequest, LoadBodyInvalid
from tests.engine_process.conftest import engine_processes
from tests.engines.engine_fakes import fakes_in_engine_processes, recorded_calls
from tests.engines.runtime_driver import assert_refused_unchanged, generate, load, unload, wait_for_state
from tests.runtime.helpers import LOAD_CYCLE, UNLOAD_CYCLE, moves
from tests.spec_examples import VLLM_BODY

GEMMA = "google/gemma-4-26B-A4B-it"
BASE_ARGS = {"model": GEMMA, "tensor_parallel_size": 1, "dtype": "auto", "enforce_eager": False, "trust_remote_code": False}


def gemma(**fields) -> dict:
    """The recording fake lives in this process's sys.modules, so the engine runs here too (isolation none)."""
    return {"backend": "vllm", "model_path": GEMMA, "prompt_format": "gemma4_template", "isolation": "none", **fields}


async def test_the_spec_example_body_becomes_exact_engine_arguments(fake_vllm, runtime_service):
    service, _ = await runtime_service(
        {"m": gemma(vllm_gpu_memory_utilization=0.1, vllm_mm_processor_kwargs={"do_pan_and_scan": True})}
    )
    entry = await load(service, "m", VLLM_BODY)
    assert (entry["runtime_state"], entry["last_error"]) == ("loaded", None)
    assert entry["load_override"] == VLLM_BODY
    assert fake_vllm.named("AsyncEngineArgs") == [
        {
            **BASE_ARGS,
            "max_model_len": 16384,
            "gpu_memory_utilization": 0.1,
            "kv_cache_dtype": "fp8",
            "kv_cache_memory_bytes": 2147483648,
            "mm_processor_kwargs": {"do_pan_and_scan": True, "max_pixels": 4014080},
            "speculative_config": {
                "method": "mtp",
                "num_speculative_tokens": 1,
                "model": "google/gemma-4-26B-A4B-it-assistant",
                "moe_backend": "triton",
                "attention_backend": "triton_attn",
            },
        }
    ]


async def test_a_bare_definition_leaves_every_optional_argument_to_vllm(fake_vllm, runtime_service):
    service, _ = await runtime_service({"m": gemma()})
    await load(service, "m")
    assert fake_vllm.named("AsyncEngineArgs") == [BASE_ARGS]


async def test_every_definition_field_maps_to_its_engine_argument(fake_vllm, runtime_service):
    definition = gemma(
        vllm_max_model_len=8192,
        vllm_gpu_memory_utilization=0.05,
        vllm_kv_cache_dtype="fp8_e5m2",
        vllm_kv_cache_memory_bytes=1073741824,
        vllm_max_pixels=802816,
        vllm_mm_processor_kwargs={"max_pixels": 1, "min_pixels": 3136},
        vllm_speculative_method="draft_model",
        vllm_speculative_model="/models/draft",
        vllm_tensor_parallel_size=2,
        vllm_dtype="bfloat16",
        vllm_quantization="awq",
        vllm_enforce_eager=True,
        vllm_trust_remote_code=True,
        vllm_reasoning_parser="qwen3",
    )
    service, _ = await runtime_service({"m": definition})
    await load(service, "m")
    assert fake_vllm.named("AsyncEngineArgs") == [
        {
            "model": GEMMA,
            "tensor_parallel_size": 2,
            "dtype": "bfloat16",
            "enforce_eager": True,
            "trust_remote_code": True,
            "max_model_len": 8192,
            "gpu_memory_utilization": 0.05,
            "kv_cache_dtype": "fp8_e5m2",
            "kv_cache_memory_bytes": 1073741824,
            "quantization": "awq",
            "reasoning_parser": "qwen3",
            # vllm_max_pixels wins over a max_pixels in the configured kwargs
            "mm_processor_kwargs": {"max_pixels": 802816, "min_pixels": 3136},
            # num_speculative_tokens defaults to 1, unset backends are left out
            "speculative_config": {"method": "draft_model", "num_speculative_tokens": 1, "model": "/models/draft"},
        }
    ]


async def test_a_null_speculative_method_disables_the_configured_path(fake_vllm, runtime_service):
    service, _ = await runtime_service(
        {"m": gemma(vllm_speculative_method="mtp", vllm_speculative_model="assistant", vllm_num_speculative_tokens=3)}
    )
    entry = await load(service, "m", {"vllm_speculative_method": None, "vllm_max_model_len": 4096})
    assert entry["load_override"] == {"vllm_speculative_method": None, "vllm_max_model_len": 4096}
    assert fake_vllm.named("AsyncEngineArgs") == [{**BASE_ARGS, "max_model_len": 4096}]


async def test_a_local_model_folder_resolves_against_the_settings_file(fake_vllm, runtime_service, tmp_path):
    service, _ = await runtime_service({"m": {"backend": "vllm", "model_path": "models/qwen3", "isolation": "none"}})
    folder = tmp_path / "settings0" / "models" / "qwen3"
    folder.mkdir(parents=True)
    await load(service, "m")
    assert fake_vllm.named("AsyncEngineArgs")[0]["model"] == str(folder)


@pytest.mark.parametrize(
    "body, error, param",
    [
        ({"vllm_max_model_len": 1000}, InvalidLoadRequest, "vllm_max_model_len"),
        ({"vllm_kv_cache_dtype": "int3"}, InvalidLoadRequest, "vllm_kv_cache_dtype"),
        ({"vllm_kv_cache_memory_bytes": 1000}, InvalidLoadRequest, "vllm_kv_cache_memory_bytes"),
        ({"vllm_max_pixels": 1000}, InvalidLoadRequest, "vllm_max_pixels"),
        ({"exllama_cache_size": 8192}, InvalidLoadRequest, "exllama_cache_size"),
        ({"llama_server_n_ctx": 4096}, InvalidLoadRequest, "llama_server_n_ctx"),
        ({"target_inflight": 4}, InvalidLoadRequest, "target_inflight"),
        ({"vllm_max_model_len": 0}, LoadBodyInvalid, None),
    ],
)
async def test_bad_load_bodies_are_refused_without_a_state_change(fake_vllm, runtime_service, body, error, param):
    service, events = await runtime_service({"m": gemma()})
    await assert_refused_unchanged(service, events, body, error, param, fake_vllm)


async def test_overrides_on_a_loaded_model_are_refused(fake_vllm, runtime_service):
    service, _ = await runtime_service({"m": gemma()})
    await load(service, "m", {"vllm_max_model_len": 4096})
    with pytest.raises(InvalidLoadRequest):
        await load(service, "m", {"vllm_max_model_len": 8192})
    entry = await service.handle("get_model", {"name": "m"}, None)
    assert (entry["runtime_state"], entry["load_override"]) == ("loaded", {"vllm_max_model_len": 4096})
    assert len(fake_vllm.named("from_engine_args")) == 1


@pytest.mark.parametrize("prompt_format", ["gemma4_template", "qwen3_template"])
async def test_thinking_modes_render_the_template_switch(fake_vllm, runtime_service, prompt_format):
    service, _ = await runtime_service({"m": gemma(prompt_format=prompt_format, enable_thinking=False)})
    entry = await load(service, "m")
    assert entry["capabilities"]["thinking_modes"] == ["default", "enabled", "disabled"]
    for thinking in ("enabled", "disabled", "default"):
        await generate(service, "m", "Why?", thinking=thinking, instructions="Be brief.")
    head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n"
    empty_thoughts = "<think>\n\n</think>\n\n"
    assert fake_vllm.prompts == [head, head + empty_thoughts, head + empty_thoughts]  # default: enable_thinking false


async def test_thinking_is_refused_outside_qwen3_and_gemma4(fake_vllm, runtime_service):
    from runtime.errors import ThinkingUnsupported

    service, _ = await runtime_service({"m": gemma(prompt_format="mistral_template")})
    await load(service, "m")
    with pytest.raises(ThinkingUnsupported):
        await generate(service, "m", thinking="disabled")
    assert fake_vllm.named("generate") == []


async def test_lifecycle_through_the_pool(fake_vllm, runtime_service):
    service, events = await runtime_service({"m": gemma(replica_max=2)})
    entry = await load(service, "m", {"replicas": 2})
    assert (entry["runtime_state"], entry["loaded_replicas"]) == ("loaded", 2)
    assert len(fake_vllm.named("from_engine_args")) == 2  # one AsyncLLM per replica

    result, deltas = await generate(service, "m", "Hi", max_output_tokens=64, temperature=0.2, top_p=0.9, stream=True)
    prompt = fake_vllm.prompts[-1]
    assert deltas == ["Hello", " from", " a", " fake"]
    assert result == {
        "text": "Hello from a fake",
        "finish_reason": "stop",
        "usage": {"input_tokens": len(prompt), "output_tokens": 4},
    }
    assert fake_vllm.named("encode")[-1] == {"add_special_tokens": False}  # the template carries the specials
    assert fake_vllm.named("generate")[-1]["prompt"] == {"prompt_token_ids": [ord(c) for c in prompt]}
    assert fake_vllm.named("SamplingParams")[-1] == {
        "max_tokens": 64,
        "temperature": 0.2,
        "top_p": 0.9,
        "output_kind": fake_vllm.RequestOutputKind.DELTA,
    }
    short, _ = await generate(service, "m", max_output_tokens=2)
    assert (short["text"], short["finish_reason"], short["usage"]["output_tokens"]) == ("Hello from", "length", 2)

    await unload(service, "m")
    assert fake_vllm.names()[-3:] == ["shutdown", "shutdown", "cleanup_dist_env_and_memory"]
    assert moves(events, "m") == LOAD_CYCLE + UNLOAD_CYCLE


async def test_a_dead_engine_fails_the_model(fake_vllm, runtime_service):
    from runtime.errors import BackendError

    fake_vllm.die_after = 1
    service, events = await runtime_service({"m": gemma()})
    await load(service, "m")
    with pytest.raises(BackendError):
        await generate(service, "m")
    entry = await wait_for_state(service, "m", "failed")
    assert entry["runtime_state"] == "failed"
    assert entry["last_error"] == "the vLLM engine died: EngineCore encountered an issue"
    assert moves(events, "m") == LOAD_CYCLE + [("loaded", "failed")]
    for _ in range(100):  # the dead engine is released in the background
        if "cleanup_dist_env_and_memory" in fake_vllm.names():
            break
        await asyncio.sleep(0.01)
    assert fake_vllm.names()[-2:] == ["shutdown", "cleanup_dist_env_and_memory"]


async def test_an_engine_that_fails_to_start_fails_the_load(fake_vllm, runtime_service):
    fake_vllm.fail_load = "CUDA out of memory"
    service, events = await runtime_service({"m": gemma()})
    entry = await load(service, "m")
    # An out-of-memory failure names the device it was placed on (runtime.pool.memory raises its estimate).
    assert (entry["runtime_state"], entry["last_error"]) == (
        "failed", f"out of memory on {entry['placement'][0]}: replica 1 of 1 failed to load: CUDA out of memory"
    )
    assert moves(events, "m") == [("unloaded", "loading"), ("loading", "failed")]


async def test_a_tokenizer_without_chat_template_fails_the_load(fake_vllm, runtime_service):
    fake_vllm.chat_template = None
    service, _ = await runtime_service({"m": gemma()})
    entry = await load(service, "m")
    assert entry["last_error"] == f"replica 1 of 1 failed to load: the tokenizer of {GEMMA} has no chat template"
    assert fake_vllm.names()[-1] == "shutdown"


async def test_without_vllm_the_load_fails_with_a_clear_error(monkeypatch, runtime_service):
    monkeypatch.setitem(sys.modules, "vllm", None)
    service, _ = await runtime_service({"m": gemma()})
    entry = await load(service, "m")
    assert entry["runtime_state"] == "failed"
    assert entry["last_error"].startswith("replica 1 of 1 failed to load: vLLM is not installed in this environment")


async def test_in_an_engine_process_without_vllm_the_load_fails_with_the_same_error(runtime_service):
    """vLLM is not installed in the test environment: the engine process reports what the runtime would."""
    service, _ = await runtime_service({"m": gemma(isolation="process")})
    entry = await load(service, "m")
    assert entry["runtime_state"] == "failed"
    assert entry["last_error"].startswith("replica 1 of 1 failed to load: vLLM is not installed in this environment")


async def test_the_engine_runs_in_an_engine_process_with_the_same_arguments(runtime_service, tmp_path, monkeypatch):
    """The fake as a package the engine process imports; its calls come back through a file."""
    records = tmp_path / "vllm-calls.jsonl"
    fakes_in_engine_processes(monkeypatch, records)
    service, events = await runtime_service({"m": gemma(isolation="process")})
    entry = await load(service, "m", {"vllm_max_model_len": 4096})
    assert (entry["runtime_state"], entry["last_error"]) == ("loaded", None)
    [engine] = service.pool.controller("m").engines
    assert engine.process.pid in [p.pid for p in engine_processes()]
    result, deltas = await generate(service, "m", "Hi", max_output_tokens=64, stream=True)
    assert "".join(deltas) == result["text"] == "Hello from a fake"  # deltas coalesce on the way
    await unload(service, "m")
    calls = recorded_calls(records)
    assert [arguments for name, arguments in calls if name == "AsyncEngineArgs"] == [{**BASE_ARGS, "max_model_len": 4096}]
    assert [name for name, _ in calls][-2:] == ["shutdown", "cleanup_dist_env_and_memory"]
    assert moves(events, "m") == LOAD_CYCLE + UNLOAD_CYCLE
    assert engine_processes() == []


async def test_a_template_that_refuses_the_messages_is_a_400(fake_vllm, runtime_service):
    from runtime.errors import InvalidRequest

    fake_vllm.chat_template = "{{ raise_exception('System role not supported') }}"
    service, _ = await runtime_service({"m": gemma()})
    await load(service, "m")
    with pytest.raises(InvalidRequest) as refused:
        await generate(service, "m", instructions="Be brief.")
    assert refused.value.message == (
        "the model's chat template refused these messages: the chat template failed: System role not supported"
    )
    assert fake_vllm.named("generate") == []
