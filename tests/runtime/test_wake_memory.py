"""A wake is planned as a load is (runtime.model.residency ``_plan_wake``): stub models on a 500 MiB cpu
budget, ``sleepy`` 300 MiB awake and 50 asleep (``stub_sleep_mib``).  With room it wakes; without
room and ``idle_lru`` other idle models are relieved or evicted for it (never the one waking);
without room and no eviction an admin wake is 409 ``insufficient_memory`` with the plan, a request
that would wake it fails with the same error, and it stays asleep.  Exact event sequences."""
from __future__ import annotations

import asyncio
import json

import pytest

from runtime.errors import InsufficientMemory, ModelUnloading
from runtime.pool.model_pool import ModelPool
from runtime.model.residency import ModelEvent
from runtime.model.tickets import Ticket
from tests.engines.test_gpu import FakeNvml, install_nvml


def stub(mib: int, **fields) -> dict:
    return {"backend": "stub", "device": "cpu", "stub_vram_mib": mib, **fields}


MODELS = {
    "sleepy": stub(300, stub_sleep_mib=50),
    "filler": stub(400),  # cannot sleep: only an eviction frees it
    "dozer": stub(400, stub_sleep_mib=100),  # a sleep frees 300
}


def _entry(event) -> tuple:
    if isinstance(event, ModelEvent):
        return event.model, event.kind, event.details["reason"], event.details.get("for_model")
    return event.model, f"{event.old.value}->{event.new.value}", event.reason


async def _pool(tmp_path, monkeypatch, eviction: str, neighbour: str | None):
    """``sleepy`` loaded and put to sleep, then ``neighbour`` loaded next to it (450 of 500 MiB)."""
    install_nvml(monkeypatch, FakeNvml([]))
    path = tmp_path / "settings.json"
    memory = {"devices": {"cpu": {"budget_mib": 500}}, "eviction": eviction}
    path.write_text(json.dumps({"models": MODELS, "memory": memory}))
    events = []
    pool = ModelPool(str(path), listeners=[events.append])
    await pool.start(load_enabled=False)
    sleepy = pool.controller("sleepy")
    await sleepy.load({}, None)
    await sleepy.sleep()
    if neighbour is not None:
        await pool.controller(neighbour).load({}, None)
        assert pool.controller(neighbour).state.value == "loaded"
    assert sleepy.residency == "sleeping" and pool.memory.charges["sleepy"].mib == {"cpu": 50}
    events.clear()
    return pool, events


@pytest.fixture
async def made(tmp_path, monkeypatch):
    pools = []

    async def make(eviction: str, neighbour: str | None):
        pool, events = await _pool(tmp_path, monkeypatch, eviction, neighbour)
        pools.append(pool)
        return pool, events

    yield make
    for pool in pools:
        await pool.shutdown()


async def test_with_room_it_wakes_to_its_awake_charge(made):
    pool, events = await made("none", None)
    sleepy = pool.controller("sleepy")
    plan = sleepy.wake_plan("admin")
    assert (plan.action, plan.needed, plan.free_mib) == ("load", {"cpu": 300}, 500)
    assert (await sleepy.wake())["reason"] == "admin"
    assert [_entry(e) for e in events] == [("sleepy", "woke", "admin", None)]
    assert sleepy.residency == "active" and pool.memory.charges["sleepy"].mib == {"cpu": 300}


async def test_without_room_and_no_eviction_the_admin_wake_is_refused_with_the_plan(made):
    pool, events = await made("none", "filler")
    sleepy = pool.controller("sleepy")
    with pytest.raises(InsufficientMemory) as refused:
        await sleepy.wake()
    assert refused.value.http_status == 409 and refused.value.code == "insufficient_memory"
    assert refused.value.details == {
        "device": "cpu", "needed_mib": 300, "free_mib": 100,
        "evictable": [{"name": "filler", "charge_mib": 400}], "blocking": [],
    }
    assert refused.value.envelope()["error"]["details"] == refused.value.details
    assert events == []
    assert (sleepy.state.value, sleepy.residency) == ("loaded", "sleeping")
    assert pool.memory.charges["sleepy"].mib == {"cpu": 50} and pool.memory.waiting == set()
    assert pool.controller("filler").state.value == "loaded"


async def test_without_room_and_no_eviction_a_request_that_would_wake_it_fails_the_same_way(made):
    pool, events = await made("none", "filler")
    sleepy = pool.controller("sleepy")
    dispatched = await sleepy.admit(Ticket("r1", None))
    with pytest.raises(InsufficientMemory) as refused:
        await dispatched
    sleepy.finish(Ticket("r1", None))
    assert refused.value.details["needed_mib"] == 300 and refused.value.details["free_mib"] == 100
    assert "stays asleep" in refused.value.message
    assert events == []
    assert (sleepy.state.value, sleepy.residency, sleepy.scheduler.queue_depth) == ("loaded", "sleeping", 0)
    assert pool.memory.charges["sleepy"].mib == {"cpu": 50}
    # Room made by hand (filler unloaded): the next request wakes it.
    await pool.controller("filler").unload()
    events.clear()
    lease = await (await sleepy.admit(Ticket("r2", None)))
    assert lease.replica == 0
    assert [_entry(e) for e in events] == [("sleepy", "woke", "request", None)]


async def test_without_room_and_idle_lru_an_admin_wake_evicts_an_idle_model(made):
    pool, events = await made("idle_lru", "filler")
    sleepy = pool.controller("sleepy")
    plan = sleepy.wake_plan("admin")
    assert (plan.action, plan.evict, plan.relieve) == ("evict", ["filler"], [])
    await sleepy.wake()
    assert [_entry(e) for e in events] == [
        ("filler", "loaded->unloading", "memory_eviction"),
        ("filler", "unloading->unloaded", "memory_eviction"),
        ("sleepy", "woke", "admin", None),
    ]
    assert sleepy.residency == "active" and pool.memory.charges == {"sleepy": pool.memory.charges["sleepy"]}
    assert pool.memory.charges["sleepy"].mib == {"cpu": 300}


async def test_without_room_and_idle_lru_a_wake_puts_a_sleepable_neighbour_to_sleep_first(made):
    pool, events = await made("idle_lru", "dozer")
    sleepy, dozer = pool.controller("sleepy"), pool.controller("dozer")
    plan = sleepy.wake_plan("request")
    assert (plan.action, plan.evict, plan.relieve) == (
        "evict", [], [{"name": "dozer", "action": "sleep", "frees_mib": 300}]
    )
    lease = await (await sleepy.admit(Ticket("r1", None)))
    sleepy.finish(Ticket("r1", None))
    assert lease.replica == 0
    assert [_entry(e) for e in events] == [
        ("dozer", "slept", "memory_pressure", "sleepy"),
        ("sleepy", "woke", "request", None),
    ]
    assert (sleepy.residency, dozer.residency, dozer.state.value) == ("active", "sleeping", "loaded")
    assert {name: charge.mib for name, charge in pool.memory.charges.items()} == {
        "sleepy": {"cpu": 300}, "dozer": {"cpu": 100}
    }


async def test_a_model_waking_is_no_candidate_to_make_room(made):
    pool, events = await made("idle_lru", "filler")
    sleepy, dozer = pool.controller("sleepy"), pool.controller("dozer")
    seen = []

    def while_filler_leaves(event) -> None:
        if event.model == "filler" and getattr(event, "reason", None) == "memory_eviction" and not seen:
            plan = dozer.plan_load({}, 1, "admin")
            seen.append((sleepy.memory_idle(), plan.evictable, plan.blocking))

    pool.controller("filler").machine.listeners.append(while_filler_leaves)
    await sleepy.wake()
    assert seen == [(False, [], [{"name": "sleepy", "charge_mib": 300, "why": "busy"}])]
    assert sleepy.residency == "active" and sleepy.memory_idle()


async def _busy(pool, name: str) -> Ticket:
    """A request running on ``name`` (its lease held) until the ticket is finished."""
    ticket = Ticket(f"busy-{name}", None)
    await (await pool.controller(name).admit(ticket))
    return ticket


async def test_a_request_wake_blocked_by_a_busy_model_waits_for_it_then_makes_room(made):
    pool, events = await made("idle_lru", "filler")
    sleepy, filler = pool.controller("sleepy"), pool.controller("filler")
    running = await _busy(pool, "filler")
    assert sleepy.wake_plan("request").action == "wait"
    with pytest.raises(InsufficientMemory):  # an admin wake does not wait
        await sleepy.wake()
    ticket = Ticket("r1", None)
    dispatched = await sleepy.admit(ticket)
    assert (sleepy.waking(), pool.memory.waiting, sleepy.residency) == (True, {"sleepy"}, "sleeping")
    assert events == []
    filler.finish(running)  # idle now: the wake plans again and evicts it
    lease = await dispatched
    sleepy.finish(ticket)
    assert lease.replica == 0
    assert [_entry(e) for e in events] == [
        ("filler", "loaded->unloading", "memory_eviction"),
        ("filler", "unloading->unloaded", "memory_eviction"),
        ("sleepy", "woke", "request", None),
    ]


async def test_a_request_wake_whose_requests_are_gone_while_it_waits_does_not_happen(made):
    pool, events = await made("idle_lru", "filler")
    sleepy, filler = pool.controller("sleepy"), pool.controller("filler")
    running = await _busy(pool, "filler")
    ticket = Ticket("r1", None)
    await sleepy.admit(ticket)
    assert sleepy.waking()
    sleepy.finish(ticket)  # the client went away
    await sleepy.plan({}, None)  # the writer has handled the finish
    assert (sleepy.waking(), pool.memory.waiting) == (False, set())
    filler.finish(running)
    await filler.plan({}, None)
    await sleepy.plan({}, None)
    assert events == []
    assert (sleepy.residency, filler.state.value) == ("sleeping", "loaded")
    assert pool.memory.charges["sleepy"].mib == {"cpu": 50}


async def test_an_unload_while_a_wake_waits_for_memory_ends_the_wake(made):
    pool, events = await made("idle_lru", "filler")
    sleepy = pool.controller("sleepy")
    unloads = []

    def unload_sleepy_meanwhile(event) -> None:  # filler starts leaving for the wake: sleepy's wake waits
        if event.model == "filler" and getattr(event, "reason", None) == "memory_eviction" and not unloads:
            unloads.append(asyncio.ensure_future(sleepy.unload()))

    pool.controller("filler").machine.listeners.append(unload_sleepy_meanwhile)
    with pytest.raises(ModelUnloading):
        async with asyncio.timeout(10):  # a guard: without the behaviour the wake's caller waits forever
            await sleepy.wake()
    assert (await unloads[0]).value == "unloaded"
    assert [_entry(e) for e in events if e.model == "sleepy"] == [
        ("sleepy", "loaded->unloading", "admin"), ("sleepy", "unloading->unloaded", "admin"),
    ]
    assert not sleepy.waking() and "sleepy" not in pool.memory.charges and pool.memory.victims == {}
