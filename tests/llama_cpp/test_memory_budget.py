"""A cpu budget with real SmolLM2 engine processes: the charge is the engine process's RSS as
measured after its load, the next load uses that figure, and a second model that does not fit
next to it evicts it (idle_lru, reason memory_eviction)."""
from __future__ import annotations

from llama_helpers import SMOLLM2_MODEL, write_settings

from runtime.pool.devices import MemorySettings
from runtime.pool.model_pool import ModelPool
from runtime.model.state import RuntimeState

SMOL = {**SMOLLM2_MODEL, "gguf_n_ctx": 512, "isolation": "process"}


async def test_cpu_budget_with_smollm2_engine_processes(tmp_path):
    settings = write_settings(tmp_path, {"first": SMOL, "second": SMOL})
    events = []
    pool = ModelPool(str(settings), listeners=[events.append])
    await pool.start(load_enabled=False)
    try:
        first, second = pool.controller("first"), pool.controller("second")
        estimate = first.plan_load({}, 1, "admin").needed_mib
        assert estimate > 60  # the GGUF's weights and its KV cache
        pool.memory.configure(MemorySettings.model_validate(
            {"devices": {"cpu": {"budget_mib": int(estimate * 1.5)}}, "eviction": "idle_lru"}
        ))
        await first.load({}, None)
        assert first.state is RuntimeState.LOADED, first.last_error
        assert first.placement == ["cpu"]
        charge = pool.memory.charges["first"]
        rss = (await first.engines[0].stats())["rss_bytes"] / 2**20
        assert charge.kind == "measured" and abs(charge.mib["cpu"] - rss) < 0.2 * rss
        assert first.memory_view()["estimate_source"] == "measured"
        plan = second.plan_load({}, 1, "admin")
        assert (plan.action, plan.evict) == ("evict", ["first"])
        await second.load({}, None)
        assert second.state is RuntimeState.LOADED, second.last_error
        assert first.state is RuntimeState.UNLOADED and first.reason == "memory_eviction"
        assert [e.reason for e in events if e.model == "first"][-1] == "memory_eviction"
    finally:
        await pool.shutdown()
