"""A model shrunk under memory pressure grows back once memory frees (runtime.model.residency
``memory_grow``, runtime.pool.memory), with a real SmolLM2 engine process at 4,096 tokens
(``gguf_n_ctx_min`` 512) on a cpu budget and a stub that needs room: the stub's load shrinks it
(reason ``memory_pressure``); while the stub is loaded its context does not fit and nothing grows;
once the stub is unloaded it is reconfigured back to its definition's context (reason
``memory_freed``), the load override emptied.  Exact event sequences."""
from __future__ import annotations

import asyncio

from llama_helpers import SMOLLM2_MODEL, write_settings

from runtime.pool.devices import MemorySettings
from runtime.pool.model_pool import ModelPool
from runtime.model.residency import ModelEvent

NEW_MIB = 40
MODELS = {"floor": {**SMOLLM2_MODEL, "gguf_n_ctx": 4096, "gguf_n_ctx_min": 512, "isolation": "process"},
          "new": {"backend": "stub", "device": "cpu", "stub_vram_mib": NEW_MIB}}


def _entry(event) -> tuple:
    if isinstance(event, ModelEvent):
        return event.model, event.kind, event.details["reason"], event.details.get("changed")
    return event.model, f"{event.old.value}->{event.new.value}", event.reason


async def test_a_shrunk_model_grows_back_when_memory_frees(tmp_path):
    events = []
    pool = ModelPool(str(write_settings(tmp_path, MODELS)), listeners=[events.append])
    await pool.start(load_enabled=False)
    try:
        floor, new = pool.controller("floor"), pool.controller("new")
        await floor.load({}, None)
        awake = pool.memory.charges["floor"].mib["cpu"]
        [shrink] = [o["frees_mib"] for o in floor.memory_relief("cpu") if o["action"] == "shrink"]
        # Room for the stub only once the floor shrinks, and for the floor to grow back once the stub
        # is gone, with a margin for what the shrink and the growth measure (a few MiB either way).
        budget = pool.memory.used("cpu") + NEW_MIB - shrink // 4
        pool.memory.configure(MemorySettings.model_validate({"devices": {"cpu": {"budget_mib": budget}},
                                                             "eviction": "idle_lru"}))
        events.clear()
        await new.load({}, None)
        assert new.state.value == "loaded", new.last_error
        shrunk = {"gguf_n_ctx": {"from": 4096, "to": 512}}
        assert [_entry(e) for e in events] == [
            ("new", "unloaded->loading", "admin"),
            ("floor", "reconfigured", "memory_pressure", shrunk),
            ("new", "loading->loaded", "admin"),
        ]
        assert floor.load_override == {"gguf_n_ctx": 512} and pool.memory.shrunk == {"floor"}

        events.clear()
        await new.unload()
        async with asyncio.timeout(60):
            while floor.load_override:
                await asyncio.sleep(0.01)
        assert [_entry(e) for e in events] == [
            ("new", "loaded->unloading", "admin"),
            ("new", "unloading->unloaded", "admin"),
            ("floor", "reconfigured", "memory_freed", {"gguf_n_ctx": {"from": 512, "to": 4096}}),
        ]
        assert pool.memory.shrunk == set() and floor.residency == "active"
        assert abs(pool.memory.charges["floor"].mib["cpu"] - awake) < 0.1 * awake  # measured again, at 4,096
    finally:
        await pool.shutdown()
