"""A wake is planned as a load is (runtime.model.residency ``_plan_wake``), with a real SmolLM2 engine
process at 4,096 tokens on a cpu budget and a stub next to it.  The budget is set from the model's
own charges: the stub fits next to SmolLM2 asleep, not next to it awake.  Without eviction the
admin wake and a request are refused with insufficient_memory and it stays asleep (its engine
process too: the charge is still the sleeping one); with ``idle_lru`` the wake evicts the stub and
SmolLM2 answers again.  Exact event sequences."""
from __future__ import annotations

import pytest
from llama_helpers import SMOLLM2_MODEL, write_settings

from runtime.backends.base import Finished, GenerationRequest
from runtime.errors import InsufficientMemory
from runtime.pool.devices import MemorySettings
from runtime.pool.model_pool import ModelPool
from runtime.model.residency import ModelEvent
from runtime.model.tickets import Ticket

FILLER_MIB = 40
MODELS = {"smol": {**SMOLLM2_MODEL, "gguf_n_ctx": 4096, "isolation": "process"},
          "filler": {"backend": "stub", "device": "cpu", "stub_vram_mib": FILLER_MIB}}


def _entry(event) -> tuple:
    if isinstance(event, ModelEvent):
        return event.model, event.kind, event.details["reason"]
    return event.model, f"{event.old.value}->{event.new.value}", event.reason


async def _answer(smol) -> int:
    """The output tokens of a short generation on the replica a request is dispatched to."""
    ticket = Ticket("ask", None)
    lease = await (await smol.admit(ticket))
    request = GenerationRequest("ask", [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
                                max_output_tokens=3).resolved()
    try:
        events = [event async for event in lease.engine.generate(request)]
    finally:
        smol.finish(ticket)
    assert isinstance(events[-1], Finished)
    return events[-1].output_tokens


async def test_a_wake_that_does_not_fit_is_refused_then_makes_room_by_eviction(tmp_path):
    events = []
    pool = ModelPool(str(write_settings(tmp_path, MODELS)), listeners=[events.append])
    await pool.start(load_enabled=False)
    memory = pool.memory
    smol, filler = pool.controller("smol"), pool.controller("filler")

    def budget(mib: int, eviction: str) -> None:
        memory.configure(MemorySettings.model_validate({"devices": {"cpu": {"budget_mib": mib}}, "eviction": eviction}))

    try:
        await smol.load({}, None)
        assert smol.state.value == "loaded", smol.last_error
        awake = memory.charges["smol"].mib["cpu"]
        await smol.sleep()
        asleep = memory.charges["smol"].mib["cpu"]
        assert asleep < awake - FILLER_MIB  # the context and KV cache of 4,096 tokens are gone
        limit = awake + FILLER_MIB // 2  # the stub fits next to it asleep, not awake; alone, it fits awake
        budget(limit, "none")
        await filler.load({}, None)
        assert filler.state.value == "loaded", filler.last_error
        events.clear()

        plan = {"device": "cpu", "needed_mib": awake, "free_mib": limit - FILLER_MIB,
                "evictable": [{"name": "filler", "charge_mib": FILLER_MIB}], "blocking": []}
        with pytest.raises(InsufficientMemory) as refused:
            await smol.wake()
        assert refused.value.details == plan
        with pytest.raises(InsufficientMemory) as failed:
            await (await smol.admit(Ticket("r1", None)))
        smol.finish(Ticket("r1", None))
        assert failed.value.details == plan
        assert events == []
        assert (smol.state.value, smol.residency, memory.charges["smol"].mib["cpu"]) == ("loaded", "sleeping", asleep)

        budget(limit, "idle_lru")
        await smol.wake()
        assert [_entry(e) for e in events] == [
            ("filler", "loaded->unloading", "memory_eviction"),
            ("filler", "unloading->unloaded", "memory_eviction"),
            ("smol", "woke", "admin"),
        ]
        assert smol.residency == "active" and memory.charges["smol"].mib["cpu"] > asleep + FILLER_MIB
        assert await _answer(smol) > 0
    finally:
        await pool.shutdown()
