"""Memory-aware placement (runtime.pool.memory) with stub models on a fake NVML with two GPUs and a cpu
budget: budgets, placement, admission with the plan, reservations, measured charges, idle_lru
eviction (fewest, least recently used first), pins and busy models never evicted."""
from __future__ import annotations

import asyncio
import json

import pytest

from runtime.errors import InsufficientMemory
from runtime.pool.memory_plan import fewest_lru
from runtime.pool.model_pool import ModelPool
from runtime.model.tickets import Ticket
from runtime.model.state import RuntimeState
from tests.engines.test_gpu import FakeNvml, install_nvml

S = RuntimeState
MEMORY = {"devices": {"cuda:0": {"budget_mib": 1000}, "cpu": {"budget_mib": 500}}, "eviction": "none"}


@pytest.fixture
def two_gpus(monkeypatch):
    return install_nvml(monkeypatch, FakeNvml([("GPU A", 0, 10000), ("GPU B", 500, 20000)]))


def stub(mib: int, device="cuda:0", **fields) -> dict:
    return {"backend": "stub", "device": device, "stub_vram_mib": mib, **fields}


async def start(folder, models: dict, memory: dict | None = None) -> tuple[ModelPool, list]:
    path = folder / "settings.json"
    path.write_text(json.dumps({"models": models, "memory": memory if memory is not None else MEMORY}))
    events = []
    pool = ModelPool(str(path), listeners=[events.append])
    await pool.start(load_enabled=False)
    return pool, events


def moves(events, model):
    return [(e.old.value, e.new.value, e.reason) for e in events if e.model == model]


async def use(pool: ModelPool, name: str, request_id: str) -> None:
    """One request that starts and finishes on ``name`` (it becomes the most recently used)."""
    controller = pool.controller(name)
    ticket = Ticket(request_id, "k", cost_estimate=1)
    lease = await (await controller.admit(ticket))
    assert lease.engine is controller.engines[0]
    controller.finish(ticket, 1)
    await asyncio.sleep(0)


async def test_budgets_of_listed_and_found_devices(tmp_path, two_gpus):
    pool, _ = await start(tmp_path, {})
    try:
        devices = pool.memory.devices
        assert (devices["cuda:0"].budget_mib, devices["cuda:0"].total_mib) == (1000, 10000)
        assert devices["cuda:1"].budget_mib == 20000 - 1024  # found, not listed: total minus the GPU reserve
        assert devices["cpu"].budget_mib == 500
        assert list(devices) == ["cpu", "cuda:0", "cuda:1"]
    finally:
        await pool.shutdown()


async def test_invalid_memory_settings_and_devices_are_refused(tmp_path, two_gpus):
    from runtime.errors import InvalidSettings

    for memory, models in (
        ({"devices": {"gpu0": {}}}, {}),
        ({"eviction": "lru"}, {}),
        ({"devices": {"cpu": {"budget_mib": -1}}}, {}),
        (MEMORY, {"m": stub(1, device="cuda")}),
        (MEMORY, {"m": stub(1, device=["cuda:0", "cuda:0"])}),
    ):
        with pytest.raises(InvalidSettings):
            await start(tmp_path, models, memory)


async def test_a_load_that_does_not_fit_is_refused_with_the_plan_and_changes_nothing(tmp_path, two_gpus):
    pool, events = await start(tmp_path, {"a": stub(600), "b": stub(500, pinned=True), "c": stub(300)})
    try:
        await pool.controller("a").load({}, None)
        await pool.controller("c").load({}, None)
        before = len(events)
        with pytest.raises(InsufficientMemory) as refused:
            await pool.controller("b").load({}, None)
        assert refused.value.http_status == 409
        assert refused.value.details == {
            "device": "cuda:0", "needed_mib": 500, "free_mib": 100,
            "evictable": [{"name": "a", "charge_mib": 600}, {"name": "c", "charge_mib": 300}], "blocking": [],
        }
        assert refused.value.envelope()["error"]["details"] == refused.value.details
        b = pool.controller("b")
        assert (b.state, b.last_error, b.placement, len(events)) == (S.UNLOADED, None, None, before)
        assert pool.memory.charges["a"].mib == {"cuda:0": 600} and "b" not in pool.memory.charges
    finally:
        await pool.shutdown()


async def test_the_stub_cost_counts_on_cpu_too(tmp_path, two_gpus):
    pool, _ = await start(tmp_path, {"small": stub(400, device="cpu"), "big": stub(200, device="cpu")})
    try:
        await pool.controller("small").load({}, None)
        with pytest.raises(InsufficientMemory) as refused:
            await pool.controller("big").load({}, None)
        assert (refused.value.details["device"], refused.value.details["free_mib"]) == ("cpu", 100)
    finally:
        await pool.shutdown()


async def test_auto_picks_the_gpu_with_the_most_free_budget_that_fits(tmp_path, two_gpus):
    memory = {"devices": {"cuda:0": {"budget_mib": 1000}, "cuda:1": {"budget_mib": 2000}}}
    models = {"big": stub(1500, device="auto"), "mid": stub(800, device="auto"), "tiny": stub(100, device="auto")}
    pool, _ = await start(tmp_path, models, memory)
    try:
        await pool.controller("big").load({}, None)  # only cuda:1 fits
        await pool.controller("mid").load({}, None)  # cuda:0 has 1000 free, cuda:1 500
        await pool.controller("tiny").load({}, None)  # cuda:0 200 free, cuda:1 500
        placements = {name: pool.controller(name).placement for name in models}
        assert placements == {"big": ["cuda:1"], "mid": ["cuda:0"], "tiny": ["cuda:1"]}
        from runtime.observe.read_models import model_entry

        entry = model_entry(pool.controller("tiny"))
        assert entry["placement"] == ["cuda:1"]
        assert entry["memory"]["charge_mib"] == {"cuda:1": 100} and entry["memory"]["charge"] == "measured"
    finally:
        await pool.shutdown()


async def test_a_tensor_parallel_list_is_charged_on_each_gpu(tmp_path, two_gpus):
    memory = {"devices": {"cuda:0": {"budget_mib": 1000}, "cuda:1": {"budget_mib": 1000}}}
    pool, _ = await start(tmp_path, {"tp": stub(1600, device=["cuda:0", "cuda:1"])}, memory)
    try:
        await pool.controller("tp").load({}, None)
        assert pool.memory.charges["tp"].mib == {"cuda:0": 800, "cuda:1": 800}
    finally:
        await pool.shutdown()


async def test_the_charge_becomes_what_was_measured_and_the_next_estimate_uses_it(tmp_path, two_gpus):
    pool, _ = await start(tmp_path, {"m": stub(300, stub_observed_mib=450, replica_max=2), "n": stub(600)})
    try:
        m = pool.controller("m")
        assert m.memory_view()["estimate_mib"] == 300 and m.memory_view()["estimate_source"] == "estimate"
        await m.load({}, None)
        assert pool.memory.charges["m"].mib == {"cuda:0": 450} and pool.memory.charges["m"].kind == "measured"
        with pytest.raises(InsufficientMemory) as refused:  # 550 free after the measured 450, not 700
            await pool.controller("n").load({}, None)
        assert refused.value.details["free_mib"] == 550
        await m.unload()
        assert "m" not in pool.memory.charges
        view = m.memory_view()
        assert (view["estimate_mib"], view["estimate_source"], view["charge"]) == (450, "measured", None)
        plan = m.plan_load({}, 2, "admin")
        assert plan.needed_mib == 900  # the measured figure per replica, times the replicas
    finally:
        await pool.shutdown()


async def test_two_concurrent_loads_cannot_count_the_same_free_memory(tmp_path, two_gpus):
    models = {"a": stub(600, stub_load_seconds=0.2), "b": stub(600, stub_load_seconds=0.2)}
    pool, _ = await start(tmp_path, models)
    try:
        results = await asyncio.gather(
            pool.controller("a").load({}, None), pool.controller("b").load({}, None), return_exceptions=True
        )
        refused = [r for r in results if isinstance(r, InsufficientMemory)]
        assert len(refused) == 1 and refused[0].details["free_mib"] == 400
        states = sorted(pool.controller(name).state.value for name in models)
        assert states == ["loaded", "unloaded"]
    finally:
        await pool.shutdown()


async def test_a_failed_load_gives_its_reservation_back(tmp_path, two_gpus):
    pool, _ = await start(tmp_path, {"bad": stub(900, stub_fail_load="boom"), "good": stub(900)})
    try:
        await pool.controller("bad").load({}, None)
        assert pool.controller("bad").state is S.FAILED and "bad" not in pool.memory.charges
        await pool.controller("good").load({}, None)
        assert pool.controller("good").state is S.LOADED
    finally:
        await pool.shutdown()


async def test_an_out_of_memory_failure_raises_the_next_estimate(tmp_path, two_gpus):
    pool, _ = await start(tmp_path, {"m": stub(400, stub_fail_load="CUDA out of memory: tried to allocate 700 MiB")})
    try:
        m = pool.controller("m")
        await m.load({}, None)
        assert m.state is S.FAILED and m.last_error.startswith("out of memory on cuda:0")
        view = m.memory_view()
        assert (view["estimate_mib"], view["estimate_source"]) == (700, "raised_after_oom")
    finally:
        await pool.shutdown()


def test_fewest_then_least_recently_used():
    lru = [{"name": "old", "charge_mib": 300}, {"name": "mid", "charge_mib": 300}, {"name": "new", "charge_mib": 400}]
    assert fewest_lru(lru, 400) == ["new"]  # one model is enough: the only one that big
    assert fewest_lru(lru, 300) == ["old"]
    assert fewest_lru(lru, 500) == ["old", "mid"]
    assert fewest_lru(lru, 650) == ["old", "new"]
    assert fewest_lru(lru, 1001) is None


async def test_idle_lru_evicts_the_fewest_least_recently_used_models(tmp_path, two_gpus):
    memory = {**MEMORY, "eviction": "idle_lru"}
    models = {"a": stub(300), "b": stub(300), "c": stub(400), "d": stub(500)}
    pool, events = await start(tmp_path, models, memory)
    try:
        for name in ("a", "b", "c"):
            await pool.controller(name).load({}, None)
        await use(pool, "b", "r1")
        await use(pool, "a", "r2")
        await use(pool, "c", "r3")  # least recently used first: b, a, c
        await pool.controller("d").load({}, None)
        assert pool.controller("d").state is S.LOADED
        states = {name: pool.controller(name).state for name in "abc"}
        assert states == {"a": S.UNLOADED, "b": S.UNLOADED, "c": S.LOADED}
        for name in "ab":
            assert moves(events, name)[-2:] == [
                ("loaded", "unloading", "memory_eviction"), ("unloading", "unloaded", "memory_eviction")
            ]
        assert pool.controller("a").reason == "memory_eviction"
        assert pool.memory.used("cuda:0") == 900
    finally:
        await pool.shutdown()


async def test_pinned_and_busy_models_are_never_evicted_and_an_admin_load_is_refused(tmp_path, two_gpus):
    memory = {**MEMORY, "eviction": "idle_lru"}
    pool, _ = await start(tmp_path, {"p": stub(500, pinned=True), "busy": stub(400), "new": stub(300)}, memory)
    try:
        await pool.controller("p").load({}, None)
        await pool.controller("busy").load({}, None)
        ticket = Ticket("held", "k", cost_estimate=1)
        await (await pool.controller("busy").admit(ticket))  # in flight until finished
        with pytest.raises(InsufficientMemory) as refused:
            await pool.controller("new").load({}, None)
        assert refused.value.details["evictable"] == []
        assert refused.value.details["blocking"] == [
            {"name": "p", "charge_mib": 500, "why": "pinned"}, {"name": "busy", "charge_mib": 400, "why": "busy"}
        ]
        assert {pool.controller(n).state for n in ("p", "busy")} == {S.LOADED}
        pool.controller("busy").finish(ticket, 1)
    finally:
        await pool.shutdown()


async def test_a_request_triggered_load_waits_for_a_busy_model_then_evicts_it(tmp_path, two_gpus):
    memory = {**MEMORY, "eviction": "idle_lru"}
    models = {"busy": stub(800), "wanted": stub(500, load_on_request=True, load_wait_timeout_seconds=30)}
    pool, events = await start(tmp_path, models, memory)
    try:
        busy, wanted = pool.controller("busy"), pool.controller("wanted")
        await busy.load({}, None)
        held = Ticket("held", "k", cost_estimate=1)
        await (await busy.admit(held))
        request = asyncio.create_task(wanted.admit(Ticket("w", "k", cost_estimate=1)))
        await asyncio.sleep(0.05)
        assert wanted.state is S.LOADING and wanted.memory_view()["awaiting_memory"] is True
        assert busy.state is S.LOADED  # busy: never evicted while its request runs
        busy.finish(held, 1)
        lease = await asyncio.wait_for(await asyncio.wait_for(request, 5), 5)
        assert lease.engine is wanted.engines[0] and wanted.state is S.LOADED
        assert moves(events, "busy")[-1] == ("unloading", "unloaded", "memory_eviction")
        wanted.finish(Ticket("w", "k"), 1)
    finally:
        await pool.shutdown()


async def test_a_request_triggered_load_that_can_never_fit_fails_its_requests(tmp_path, two_gpus):
    models = {"p": stub(800, pinned=True), "wanted": stub(500, load_on_request=True)}
    pool, _ = await start(tmp_path, models, {**MEMORY, "eviction": "idle_lru"})
    try:
        await pool.controller("p").load({}, None)
        with pytest.raises(InsufficientMemory):
            await pool.controller("wanted").admit(Ticket("w", "k", cost_estimate=1))
        assert pool.controller("wanted").state is S.UNLOADED
    finally:
        await pool.shutdown()
