"""LoRA adapters on the in-process vLLM engine against the recording fake of vLLM: the engine is
built for every declared adapter, the ones ``adapters_loaded`` keeps are added with
``AsyncLLM.add_lora`` once it stands, a request for one carries its ``LoRARequest``, and a
reconfigure of ``adapters_loaded`` calls ``add_lora`` / ``remove_lora`` on the running engine
(never a new one); a request for an adapter left out is 409, before vLLM sees it."""
from __future__ import annotations

import pytest

from runtime.errors import AdapterNotLoaded, InvalidLoadRequest
from tests.engines.engine_fakes import fakes_in_engine_processes, recorded_calls
from tests.engines.runtime_driver import assert_refused_unchanged, generate, load
from tests.engines.test_vllm import BASE_ARGS, gemma
from tests.runtime.helpers import LOAD_CYCLE, moves

ADAPTERS = {"sql": {"path": "/adapters/sql"}, "poet": {"path": "/adapters/poet", "aliases": ["poet"]}}
SQL = {"lora_name": "sql", "lora_int_id": 1, "lora_path": "/adapters/sql"}
POET = {"lora_name": "poet", "lora_int_id": 2, "lora_path": "/adapters/poet"}


def reconfigure(service, body: dict):
    return service.handle("reconfigure", {"name": "m", "body": body}, None)


def lora_requests(fake) -> list:
    return [call["lora_request"] for call in fake.named("generate")]


async def test_each_adapter_is_added_once_the_engine_stands_and_a_request_carries_its_own(fake_vllm, runtime_service):
    service, _ = await runtime_service({"m": gemma(adapters=ADAPTERS, vllm_max_lora_rank=64)})
    await load(service, "m")
    assert fake_vllm.named("AsyncEngineArgs") == [
        {**BASE_ARGS, "enable_lora": True, "max_loras": 2, "max_lora_rank": 64}
    ]
    assert fake_vllm.calls[1:] == [("from_engine_args", {"engine_args": fake_vllm.named("AsyncEngineArgs")[0]}),
                                   ("add_lora", {"lora_request": SQL}), ("add_lora", {"lora_request": POET})]
    await generate(service, "m")
    await generate(service, "m:sql")
    await generate(service, "poet")  # the adapter's alias
    assert lora_requests(fake_vllm) == [None, SQL, POET]
    assert len(fake_vllm.named("from_engine_args")) == 1  # no load for an adapter


async def test_adapters_loaded_adds_only_those_it_keeps_and_a_request_for_another_is_409(fake_vllm, runtime_service):
    service, _ = await runtime_service({"m": gemma(adapters=ADAPTERS)})
    await load(service, "m", {"adapters_loaded": ["poet"]})
    assert fake_vllm.named("AsyncEngineArgs")[0]["max_loras"] == 2  # room to add sql back
    assert fake_vllm.named("add_lora") == [{"lora_request": POET}]
    with pytest.raises(AdapterNotLoaded) as refused:
        await generate(service, "m:sql")
    assert (refused.value.http_status, refused.value.param) == (409, "model")
    await generate(service, "m:poet")
    assert lora_requests(fake_vllm) == [POET]  # the refused one never reached vLLM


async def test_a_reconfigure_adds_and_removes_adapters_on_the_running_engine(fake_vllm, runtime_service):
    service, events = await runtime_service({"m": gemma(adapters=ADAPTERS)})
    await load(service, "m", {"adapters_loaded": ["sql"]})
    fake_vllm.calls.clear()

    answer = await reconfigure(service, {"adapters_loaded": ["poet"]})
    assert fake_vllm.calls == [("add_lora", {"lora_request": POET}), ("remove_lora", {"lora_id": 1})]
    assert answer["reconfigured"]["changed"] == {"adapters_loaded": {"from": ["sql"], "to": ["poet"]}}
    assert (answer["runtime_state"], answer["load_override"]) == ("loaded", {"adapters_loaded": ["poet"]})
    with pytest.raises(AdapterNotLoaded):
        await generate(service, "m:sql")
    await generate(service, "m:poet")

    fake_vllm.calls.clear()
    await reconfigure(service, {"adapters_loaded": None})  # every adapter: sql back, under its own id
    assert fake_vllm.calls == [("add_lora", {"lora_request": SQL})]
    await generate(service, "m:sql")
    assert lora_requests(fake_vllm) == [SQL]
    assert moves(events, "m") == LOAD_CYCLE  # loaded throughout: no engine was built or shut down again


async def test_an_adapter_vllm_cannot_load_leaves_the_adapters_as_they_were(fake_vllm, runtime_service):
    fake_vllm.bad_lora_paths = ("/adapters/bad",)
    service, _ = await runtime_service({"m": gemma(adapters={**ADAPTERS, "bad": {"path": "/adapters/bad"}})})
    await load(service, "m", {"adapters_loaded": ["sql"]})
    fake_vllm.calls.clear()

    with pytest.raises(InvalidLoadRequest) as refused:
        await reconfigure(service, {"adapters_loaded": ["poet", "bad"]})
    assert refused.value.param == "adapters_loaded"
    assert "'bad' from /adapters/bad: Loading lora /adapters/bad failed" in refused.value.message
    bad = {"lora_name": "bad", "lora_int_id": 3, "lora_path": "/adapters/bad"}
    assert fake_vllm.calls == [("add_lora", {"lora_request": POET}), ("add_lora", {"lora_request": bad}),
                               ("remove_lora", {"lora_id": 2})]  # poet, added by this call, taken back
    entry = await service.handle("get_model", {"name": "m"}, None)
    assert (entry["runtime_state"], entry["load_override"]) == ("loaded", {"adapters_loaded": ["sql"]})
    await generate(service, "m:sql")
    with pytest.raises(AdapterNotLoaded):
        await generate(service, "m:poet")


async def test_an_adapter_vllm_cannot_load_at_start_fails_the_load(fake_vllm, runtime_service):
    fake_vllm.bad_lora_paths = ("/adapters/poet",)
    service, _ = await runtime_service({"m": gemma(adapters=ADAPTERS)})
    entry = await load(service, "m")
    assert entry["runtime_state"] == "failed"
    assert entry["last_error"] == ("replica 1 of 1 failed to load: vLLM could not load the LoRA adapter 'poet' from "
                                   "/adapters/poet: Loading lora /adapters/poet failed")
    assert fake_vllm.names()[-1] == "shutdown"


async def test_adapters_loaded_names_declared_adapters_only(fake_vllm, runtime_service):
    service, events = await runtime_service({"m": gemma(adapters=ADAPTERS)})
    await assert_refused_unchanged(service, events, {"adapters_loaded": ["nope"]}, InvalidLoadRequest,
                                   "adapters_loaded", fake_vllm)
    await load(service, "m")
    with pytest.raises(InvalidLoadRequest) as refused:
        await reconfigure(service, {"adapters_loaded": ["sql", "nope"]})
    assert refused.value.param == "adapters_loaded"
    assert "remove_lora" not in fake_vllm.names()


async def test_in_an_engine_process_the_calls_and_the_409_cross_the_process(runtime_service, tmp_path, monkeypatch):
    records = tmp_path / "vllm-calls.jsonl"
    fakes_in_engine_processes(monkeypatch, records)
    service, _ = await runtime_service({"m": gemma(isolation="process", adapters=ADAPTERS)})
    entry = await load(service, "m", {"adapters_loaded": ["sql"]})
    assert (entry["runtime_state"], entry["last_error"]) == ("loaded", None)
    await reconfigure(service, {"adapters_loaded": ["poet"]})
    with pytest.raises(AdapterNotLoaded):
        await generate(service, "m:sql")
    await generate(service, "m:poet")
    calls = [(name, arguments) for name, arguments in recorded_calls(records) if "lora" in name or name == "generate"]
    assert [(name, arguments.get("lora_request", arguments.get("lora_id"))) for name, arguments in calls] == [
        ("add_lora", SQL), ("add_lora", POET), ("remove_lora", 1), ("generate", POET)
    ]
