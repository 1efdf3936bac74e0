"""LoRA adapters of a llama_cpp model through the runtime's operations, in an engine process:
the adapter's id and alias run on the one loaded base with the adapter (the request's adapter
crosses to the engine process), a reconfigure of ``adapters_loaded`` keeps the weights loaded
and makes a dropped adapter 409, and an embedding for an adapter is refused."""
from __future__ import annotations

import pytest
from llama_helpers import SMOLLM2_MODEL
from lora_gguf import write_lora_gguf

from runtime.errors import AdapterNotLoaded, AdapterUnsupported
from runtime.model.state import RuntimeState, TransitionEvent
from tests.engines.runtime_driver import generate, load


def loads_in(events: list) -> int:
    return sum(1 for e in events if isinstance(e, TransitionEvent) and e.new is RuntimeState.LOADING)


@pytest.fixture(scope="module")
def lora_file(tmp_path_factory, smollm2_gguf):
    return write_lora_gguf(smollm2_gguf, tmp_path_factory.mktemp("lora") / "sea.gguf")


async def test_an_adapter_runs_on_the_loaded_base_in_its_engine_process(runtime_service, lora_file):
    adapters = {"sea": {"path": str(lora_file), "aliases": ["sea-tuned"]}}
    model = {**SMOLLM2_MODEL, "gguf_n_ctx": 512, "isolation": "process", "embeddings": True, "adapters": adapters}
    service, events = await runtime_service({"m": model})
    await load(service, "m")
    loads = loads_in(events)
    ask = {"max_output_tokens": 8, "temperature": 0.0}
    base, _ = await generate(service, "m", "Name three colours of the sea.", **ask)
    adapted, _ = await generate(service, "m:sea", "Name three colours of the sea.", **ask)
    by_alias, _ = await generate(service, "sea-tuned", "Name three colours of the sea.", **ask)
    assert base["text"] != adapted["text"] and by_alias["text"] == adapted["text"]
    assert loads_in(events) == loads  # no load for an adapter

    with pytest.raises(AdapterUnsupported):
        await service.handle("embed", {"request_id": "e1", "model": "m:sea", "input": ["hi"]}, None)

    answer = await service.handle("reconfigure", {"name": "m", "body": {"adapters_loaded": []}}, None)
    assert answer["reconfigured"] and answer["runtime_state"] == "loaded"
    with pytest.raises(AdapterNotLoaded):
        await generate(service, "m:sea", "Name three colours of the sea.", **ask)
    await service.handle("reconfigure", {"name": "m", "body": {"adapters_loaded": None}}, None)
    again, _ = await generate(service, "m:sea", "Name three colours of the sea.", **ask)
    assert again["text"] == adapted["text"]
    assert loads_in(events) == loads
