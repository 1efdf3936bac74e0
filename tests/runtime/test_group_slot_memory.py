"""A swap group's slot counts as memory for a member that loads into it (issue 18): the holder the
group swaps out for the member gives its charge back before the member's engines start, so the
memory plan counts that charge as free; never twice (a holder counted for the slot is not also
an eviction candidate), never for a pinned holder, and never when a slot is free anyway."""
from __future__ import annotations

import asyncio
import json

import pytest

from runtime.errors import InsufficientMemory
from runtime.pool.model_pool import ModelPool
from runtime.model.tickets import Ticket
from runtime.model.state import RuntimeState
from tests.engines.test_gpu import FakeNvml, install_nvml

S = RuntimeState


@pytest.fixture
def one_gpu(monkeypatch):
    return install_nvml(monkeypatch, FakeNvml([("GPU A", 0, 10000)]))


def stub(mib: int, **fields) -> dict:
    return {"backend": "stub", "device": "cuda:0", "stub_vram_mib": mib, **fields}


async def start(folder, models: dict, groups: dict, eviction: str = "none") -> tuple[ModelPool, list]:
    path = folder / "settings.json"
    memory = {"devices": {"cuda:0": {"budget_mib": 1000}, "cpu": {"budget_mib": 500}}, "eviction": eviction}
    path.write_text(json.dumps({"models": models, "groups": groups, "memory": memory}))
    events = []
    pool = ModelPool(str(path), listeners=[events.append])
    await pool.start(load_enabled=False)
    return pool, events


def moves(events, model):
    return [(e.old.value, e.new.value, e.reason) for e in events if e.model == model]


GROUP = {"g": {"members": ["a", "b"], "max_loaded": 1}}


async def test_the_holder_swapped_out_for_a_member_counts_as_free_memory(tmp_path, one_gpu):
    pool, events = await start(tmp_path, {"a": stub(600), "b": stub(600)}, GROUP)
    try:
        await pool.controller("a").load({}, None)
        plan = await pool.controller("b").plan({}, None)  # the dry run agrees with the load
        assert (plan["fits"], plan["action"], plan["free_mib"], plan["slot_mib"]) == (True, "load", 400, 600)
        await pool.controller("b").load({}, None)  # 400 MiB free, plus a's 600 once its slot is b's
        assert pool.controller("b").state is S.LOADED
        swapped = [("loaded", "unloading", "group_swap"), ("unloading", "unloaded", "group_swap")]
        assert moves(events, "a")[-2:] == swapped
        assert {name: charge.mib for name, charge in pool.memory.charges.items()} == {"b": {"cuda:0": 600}}
    finally:
        await pool.shutdown()


async def test_a_holder_counted_for_the_slot_is_not_evicted_too(tmp_path, one_gpu):
    """b needs 800: 100 free + a's 600 through the slot leaves 100, which c's eviction gives;
    evicting a instead would free its slot, so no swap, and b would find 700 MiB for 800."""
    models = {"a": stub(600), "b": stub(800), "c": stub(300)}
    pool, events = await start(tmp_path, models, GROUP, eviction="idle_lru")
    try:
        await pool.controller("a").load({}, None)
        await pool.controller("c").load({}, None)
        await pool.controller("b").load({}, None)
        assert pool.controller("b").state is S.LOADED
        assert moves(events, "a")[-1] == ("unloading", "unloaded", "group_swap")
        assert moves(events, "c")[-1] == ("unloading", "unloaded", "memory_eviction")
        assert {name: charge.mib for name, charge in pool.memory.charges.items()} == {"b": {"cuda:0": 800}}
    finally:
        await pool.shutdown()


async def test_no_slot_credit_for_a_pinned_holder_or_a_free_slot(tmp_path, one_gpu):
    pool, _ = await start(tmp_path, {"a": stub(600, pinned=True), "b": stub(600)}, GROUP)
    try:
        await pool.controller("a").load({}, None)
        with pytest.raises(InsufficientMemory) as refused:  # a keeps its slot: b could never load
            await pool.controller("b").load({}, None)
        assert refused.value.details["free_mib"] == 400
        assert pool.controller("b").state is S.UNLOADED
    finally:
        await pool.shutdown()

    wide = {"g": {"members": ["a", "b"], "max_loaded": 2}}
    pool, _ = await start(tmp_path, {"a": stub(600), "b": stub(600)}, wide)
    try:
        await pool.controller("a").load({}, None)
        with pytest.raises(InsufficientMemory):  # a free slot: nobody is swapped out, a stays
            await pool.controller("b").load({}, None)
        assert pool.controller("a").state is S.LOADED
    finally:
        await pool.shutdown()


async def test_a_request_for_a_member_loads_it_into_the_slot_of_an_idle_holder(tmp_path, one_gpu):
    """load_on_request: the request's load counts the slot too, and is served once a is swapped out
    (before, it was refused with insufficient_memory although the swap would have made the room)."""
    models = {"a": stub(600, load_on_request=True), "b": stub(600, load_on_request=True)}
    pool, events = await start(tmp_path, models, GROUP)
    try:
        await pool.controller("a").load({}, None)
        b = pool.controller("b")
        ticket = Ticket("r1", "k", cost_estimate=1)
        lease = await asyncio.wait_for(await b.admit(ticket), 10)
        assert lease.engine is b.engines[0] and b.state is S.LOADED
        b.finish(ticket, 1)
        assert moves(events, "a")[-1] == ("unloading", "unloaded", "group_swap")
        assert moves(events, "b")[:2] == [("unloaded", "loading", "request"), ("loading", "loaded", "request")]
    finally:
        await pool.shutdown()


async def test_auto_placement_counts_the_slot_of_the_gpu_the_holder_leaves(tmp_path, monkeypatch):
    """b ("auto", 800 MiB): cuda:1 has 500 free, cuda:0 400 plus a's 600 once the group swaps a out
    for b.  Counted, only cuda:0 fits and b loads there; without the slot in the choice, "auto"
    took cuda:1 (the most free), where b cannot fit, and the load was refused."""
    install_nvml(monkeypatch, FakeNvml([("GPU A", 0, 10000), ("GPU B", 0, 10000)]))
    path = tmp_path / "settings.json"
    models = {"a": stub(600), "filler": stub(500, device="cuda:1"), "b": stub(800, device="auto")}
    memory = {"devices": {"cuda:0": {"budget_mib": 1000}, "cuda:1": {"budget_mib": 1000}}, "eviction": "none"}
    path.write_text(json.dumps({"models": models, "groups": GROUP, "memory": memory}))
    pool = ModelPool(str(path))
    await pool.start(load_enabled=False)
    try:
        await pool.controller("a").load({}, None)
        await pool.controller("filler").load({}, None)
        plan = await pool.controller("b").plan({}, None)
        assert (plan["fits"], plan["device"], plan["slot_mib"]) == (True, "cuda:0", 600), plan
        await pool.controller("b").load({}, None)
        assert pool.controller("b").state is S.LOADED and pool.controller("a").state is S.UNLOADED
        assert pool.memory.charges["b"].mib == {"cuda:0": 800}
    finally:
        await pool.shutdown()
