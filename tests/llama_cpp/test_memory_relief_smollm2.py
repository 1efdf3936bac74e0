"""Memory pressure shrinks and sleeps before it evicts (runtime.pool.memory ``idle_lru``, runtime.model.residency),
with two real SmolLM2 engine processes at 4,096 tokens on a cpu budget and a stub that needs room.

The budget is set from the models' own relief estimates each time, so each phase is short by a
known amount: (1) half of what shrinking ``floor`` (``gguf_n_ctx_min`` 512) frees: ``floor`` shrinks;
(2) half of what a sleep of ``plain`` frees: ``plain`` (now the least recently used) sleeps;
(3) more than ``floor``'s sleep frees: ``floor`` sleeps and ``plain`` is evicted.  Each step is an
event with reason ``memory_pressure`` naming the model it makes room for; exact sequences.
"""
from __future__ import annotations

from llama_helpers import SMOLLM2_MODEL, write_settings

from runtime.pool.devices import MemorySettings
from runtime.pool.model_pool import ModelPool
from runtime.model.residency import ModelEvent

SMOL = {**SMOLLM2_MODEL, "gguf_n_ctx": 4096, "isolation": "process"}
NEW_MIB = 40
MODELS = {"floor": {**SMOL, "gguf_n_ctx_min": 512}, "plain": SMOL,
          "new": {"backend": "stub", "device": "cpu", "stub_vram_mib": NEW_MIB}}


def _entry(event) -> tuple:
    if isinstance(event, ModelEvent):
        return event.model, event.kind, event.details["reason"], event.details.get("for_model")
    return event.model, f"{event.old.value}->{event.new.value}", event.reason


def _frees(controller, action: str) -> int:
    [option] = [o for o in controller.memory_relief("cpu") if o["action"] == action]
    return option["frees_mib"]


async def test_memory_pressure_shrinks_then_sleeps_before_it_evicts(tmp_path):
    events = []
    pool = ModelPool(str(write_settings(tmp_path, MODELS)), listeners=[events.append])
    await pool.start(load_enabled=False)
    memory = pool.memory

    def short_by(deficit: int) -> None:
        """A cpu budget with ``deficit`` MiB too few for ``new`` next to what is held now."""
        budget = memory.used("cpu") + NEW_MIB - deficit
        memory.configure(MemorySettings.model_validate({"devices": {"cpu": {"budget_mib": budget}},
                                                        "eviction": "idle_lru"}))

    async def load_new() -> list[tuple]:
        events.clear()
        await new.load({}, None)
        assert new.state.value == "loaded", new.last_error
        happened = [_entry(e) for e in events]
        short_by(NEW_MIB)  # no room for floor to grow back once new is gone (test_memory_grow_smollm2.py)
        await new.unload()
        return happened

    try:
        floor, plain, new = (pool.controller(name) for name in ("floor", "plain", "new"))
        for controller in (floor, plain):  # floor is the least recently used
            await controller.load({}, None)
            assert controller.state.value == "loaded", controller.last_error

        # (1) floor's shrink is enough (shrinks come before sleeps).
        shrink = _frees(floor, "shrink")
        assert shrink > NEW_MIB  # the KV cache of 3,584 tokens
        short_by(shrink // 2)
        planned = new.plan_load({}, 1, "admin")
        assert (planned.action, planned.evict) == ("evict", [])
        assert planned.relieve == [{"name": "floor", "action": "shrink", "frees_mib": shrink,
                                    "to": {"gguf_n_ctx": 512}}]
        assert await load_new() == [
            ("new", "unloaded->loading", "admin"),
            ("floor", "reconfigured", "memory_pressure", "new"),
            ("new", "loading->loaded", "admin"),
        ]
        assert floor.load_override == {"gguf_n_ctx": 512} and floor.residency == "active"
        assert (plain.load_override, plain.residency) == ({}, "active")

        # (2) floor cannot shrink further; plain, now the least recently used, sleeps.
        assert [o["action"] for o in floor.memory_relief("cpu")] == ["sleep"]
        held = memory.charges["plain"].mib["cpu"]
        sleep = _frees(plain, "sleep")
        assert sleep > NEW_MIB  # its context and KV cache
        short_by(sleep // 2)
        assert [(i["name"], i["action"]) for i in new.plan_load({}, 1, "admin").relieve] == [("plain", "sleep")]
        assert await load_new() == [
            ("new", "unloaded->loading", "admin"),
            ("plain", "slept", "memory_pressure", "new"),
            ("new", "loading->loaded", "admin"),
        ]
        assert plain.residency == "sleeping" and memory.charges["plain"].mib["cpu"] < held - NEW_MIB

        # (3) more than floor's sleep frees: floor sleeps, and plain (asleep, nothing more to give) goes.
        asleep = memory.charges["plain"].mib["cpu"]
        short_by(_frees(floor, "sleep") // 2 + asleep // 2 + 1)
        planned = new.plan_load({}, 1, "admin")
        assert ([(i["name"], i["action"]) for i in planned.relieve], planned.evict) == ([("floor", "sleep")], ["plain"])
        happened = await load_new()
        assert happened[0] == ("new", "unloaded->loading", "admin")
        assert happened[-1] == ("new", "loading->loaded", "admin")
        assert [e for e in happened if e[0] == "floor"] == [("floor", "slept", "memory_pressure", "new")]
        assert [e for e in happened if e[0] == "plain"] == [
            ("plain", "loaded->unloading", "memory_eviction"), ("plain", "unloading->unloaded", "memory_eviction")
        ]
        assert floor.residency == "sleeping" and floor.state.value == "loaded"
    finally:
        await pool.shutdown()
