"""vllm_serve's ``adapters_loaded`` against the fake ``vllm serve`` (VllmServeEngine): the server
starts with a ``--lora-modules`` entry per adapter kept and room for every declared one; a
reconfigure changes the adapters on the running server through vLLM's runtime LoRA routes where
``vllm_runtime_lora`` allows it (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, without which the
fake, as vLLM, serves no such route), else restarts it with the kept modules.  A request for an
adapter left out is 409 and never reaches the server."""
from __future__ import annotations

import pytest

from runtime.errors import AdapterNotLoaded, InvalidLoadRequest
from tests.engines.runtime_driver import generate, load
from tests.managed.helpers import environ_of, pidfiles, records, requests_logged, vllm_model
from tests.runtime.helpers import LOAD_CYCLE, moves

ALLOW = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def served(fake_bin, folder, **fields) -> dict:
    """The fake vllm with the adapters sql and poet (folders that exist) and bad (one that does not),
    its LoRA calls logged to ``folder/control.jsonl``."""
    for name in ("sql", "poet"):
        (folder / name).mkdir(exist_ok=True)
    adapters = {name: {"path": str(folder / name)} for name in ("sql", "poet", "missing")}
    model = vllm_model(fake_bin, folder, adapters=adapters, **fields)
    model["vllm_serve_env"]["FAKE_CONTROL_LOG"] = str(folder / "control.jsonl")
    return model


def lora_load(folder, name: str) -> dict:
    return {"method": "POST", "path": "/v1/load_lora_adapter", "body": {"lora_name": name, "lora_path": str(folder / name)}}


def lora_unload(name: str) -> dict:
    return {"method": "POST", "path": "/v1/unload_lora_adapter", "body": {"lora_name": name}}


def lora_args(argv: list[str]) -> list[str]:
    return argv[argv.index("--enable-lora"):]


def reconfigure(service, body: dict):
    return service.handle("reconfigure", {"name": "m", "body": body}, None)


async def test_with_runtime_lora_a_reconfigure_loads_and_unloads_on_the_running_server(
        runtime_service, state_dir, fake_bin, tmp_path):
    service, events = await runtime_service({"m": served(fake_bin, tmp_path, vllm_runtime_lora=True)})
    await load(service, "m", {"adapters_loaded": ["sql"]})
    [server] = pidfiles(state_dir)
    assert lora_args(server["argv"]) == ["--enable-lora", "--lora-modules", f"sql={tmp_path / 'sql'}", "--max-loras", "3"]
    assert environ_of(server["pid"])[ALLOW] == "True"

    answer = await reconfigure(service, {"adapters_loaded": ["poet"]})
    assert requests_logged(tmp_path / "control.jsonl") == [lora_load(tmp_path, "poet"), lora_unload("sql")]
    assert (answer["runtime_state"], answer["load_override"]) == ("loaded", {"adapters_loaded": ["poet"]})
    assert pidfiles(state_dir) == [server] and len(records(tmp_path / "vllm.jsonl")) == 1  # no restart
    with pytest.raises(AdapterNotLoaded):
        await generate(service, "m:sql")
    result, _ = await generate(service, "m:poet")
    assert result["text"] == "echo: Hi there"
    assert [request["model"] for request in requests_logged(tmp_path / "requests.jsonl")] == ["poet"]
    assert moves(events, "m") == LOAD_CYCLE


async def test_an_adapter_the_server_cannot_load_leaves_the_adapters_as_they_were(
        runtime_service, state_dir, fake_bin, tmp_path):
    service, _ = await runtime_service({"m": served(fake_bin, tmp_path, vllm_runtime_lora=True)})
    await load(service, "m", {"adapters_loaded": ["sql"]})

    with pytest.raises(InvalidLoadRequest) as refused:
        await reconfigure(service, {"adapters_loaded": ["poet", "missing"]})
    assert refused.value.param == "adapters_loaded"
    assert "POST /v1/load_lora_adapter for the adapter 'missing' answered 404" in refused.value.message
    # poet, loaded by this reconfigure before missing failed, is unloaded again.
    assert requests_logged(tmp_path / "control.jsonl") == [
        lora_load(tmp_path, "poet"), lora_load(tmp_path, "missing"), lora_unload("poet")
    ]
    entry = await service.handle("get_model", {"name": "m"}, None)
    assert (entry["runtime_state"], entry["load_override"]) == ("loaded", {"adapters_loaded": ["sql"]})
    await generate(service, "m:sql")
    with pytest.raises(AdapterNotLoaded):
        await generate(service, "m:poet")
    assert len(pidfiles(state_dir)) == 1 and len(records(tmp_path / "vllm.jsonl")) == 1


async def test_without_runtime_lora_a_reconfigure_restarts_the_server_with_the_kept_modules(
        runtime_service, state_dir, fake_bin, tmp_path):
    service, events = await runtime_service({"m": served(fake_bin, tmp_path)})
    await load(service, "m", {"adapters_loaded": ["sql"]})
    [before] = pidfiles(state_dir)
    assert ALLOW not in environ_of(before["pid"])

    answer = await reconfigure(service, {"adapters_loaded": ["poet"]})
    assert answer["reconfigured"]["mode"] == "restart"
    first, second = records(tmp_path / "vllm.jsonl")
    assert lora_args(first["argv"]) == ["--enable-lora", "--lora-modules", f"sql={tmp_path / 'sql'}", "--max-loras", "3"]
    assert lora_args(second["argv"]) == ["--enable-lora", "--lora-modules", f"poet={tmp_path / 'poet'}", "--max-loras", "3"]
    [after] = pidfiles(state_dir)
    assert after["pid"] != before["pid"] and requests_logged(tmp_path / "control.jsonl") == []
    with pytest.raises(AdapterNotLoaded):
        await generate(service, "m:sql")
    await generate(service, "m:poet")
    assert moves(events, "m") == LOAD_CYCLE  # loaded throughout the restart
