"""A cold start under ``idle_lru``: three 400 MiB models that load on request where two fit.
The third request's load waits for the two loads under way to finish and go idle, then evicts
the least recently used, instead of being refused; the wait is bounded by
``load_wait_timeout_seconds``."""
from __future__ import annotations

import asyncio

import pytest

from runtime.errors import InsufficientMemory, ModelLoading
from runtime.model.tickets import Ticket
from runtime.model.state import RuntimeState
from tests.engines.test_gpu import FakeNvml, install_nvml
from tests.runtime.test_memory_placement import moves, start

S = RuntimeState
BUDGET = {"cpu": {"budget_mib": 1000}}


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    install_nvml(monkeypatch, FakeNvml([]))


def cold(**fields) -> dict:
    return {"backend": "stub", "device": "cpu", "stub_vram_mib": 400, "stub_load_seconds": 0.3,
            "load_on_request": True, **fields}


async def admitted(pool, name: str) -> tuple[Ticket, asyncio.Task]:
    """A request for ``name`` (a task resolving to its lease once it runs) and its ticket."""
    ticket = Ticket(f"r-{name}", "k", cost_estimate=1)

    async def lease():
        return await (await pool.controller(name).admit(ticket))

    return ticket, asyncio.create_task(lease())


async def until(condition, seconds: float = 5.0) -> None:
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.01)


LOADED_BY_REQUEST = [("unloaded", "loading", "request"), ("loading", "loaded", "request")]


async def test_a_load_blocked_by_loads_under_way_waits_for_them_then_evicts(tmp_path):
    models = {name: cold(load_wait_timeout_seconds=30) for name in ("a", "b", "c")}
    pool, events = await start(tmp_path, models, {"devices": BUDGET, "eviction": "idle_lru"})
    a, b, c = (pool.controller(name) for name in ("a", "b", "c"))
    try:
        (ticket_a, lease_a), (ticket_b, lease_b) = await admitted(pool, "a"), await admitted(pool, "b")
        await until(lambda: a.state is S.LOADING and b.state is S.LOADING)
        ticket_c, lease_c = await admitted(pool, "c")
        await until(lambda: c.state is S.LOADING)
        assert c.memory_view()["awaiting_memory"] is True  # neither a nor b can be evicted yet
        await asyncio.wait_for(asyncio.gather(lease_a, lease_b), 5)
        assert c.state is S.LOADING and not lease_c.done()  # a and b are busy now
        a.finish(ticket_a, 1)  # a is idle first: the least recently used
        lease = await asyncio.wait_for(lease_c, 5)
        assert lease.engine is c.engines[0]
        assert moves(events, "a") == LOADED_BY_REQUEST + [
            ("loaded", "unloading", "memory_eviction"), ("unloading", "unloaded", "memory_eviction"),
        ]
        assert moves(events, "b") == moves(events, "c") == LOADED_BY_REQUEST
        assert pool.memory.charges["c"].mib == {"cpu": 400} and "a" not in pool.memory.charges
        b.finish(ticket_b, 1)
        c.finish(ticket_c, 1)
    finally:
        await pool.shutdown()


async def test_the_wait_for_loads_under_way_is_bounded_by_load_wait_timeout_seconds(tmp_path):
    models = {"a": cold(), "b": cold(), "c": cold(load_wait_timeout_seconds=0.5)}
    pool, events = await start(tmp_path, models, {"devices": BUDGET, "eviction": "idle_lru"})
    a, b, c = (pool.controller(name) for name in ("a", "b", "c"))
    try:
        (ticket_a, lease_a), (ticket_b, lease_b) = await admitted(pool, "a"), await admitted(pool, "b")
        await until(lambda: a.state is S.LOADING and b.state is S.LOADING)
        _, lease_c = await admitted(pool, "c")
        await asyncio.wait_for(asyncio.gather(lease_a, lease_b), 5)  # both busy from then on
        with pytest.raises(ModelLoading):
            await asyncio.wait_for(lease_c, 5)
        await until(lambda: c.state is S.UNLOADED)  # its only request gave up: the load is withdrawn
        assert moves(events, "c") == [("unloaded", "loading", "request"), ("loading", "unloaded", "request")]
        assert "c" not in pool.memory.charges and not pool.memory.waiting
        assert moves(events, "a") == moves(events, "b") == LOADED_BY_REQUEST
        a.finish(ticket_a, 1)
        b.finish(ticket_b, 1)
    finally:
        await pool.shutdown()


async def test_without_eviction_a_load_blocked_by_loads_under_way_is_refused(tmp_path):
    pool, events = await start(tmp_path, {name: cold() for name in ("a", "b", "c")}, {"devices": BUDGET})
    a, b = pool.controller("a"), pool.controller("b")
    try:
        (ticket_a, lease_a), (ticket_b, lease_b) = await admitted(pool, "a"), await admitted(pool, "b")
        await until(lambda: a.state is S.LOADING and b.state is S.LOADING)
        _, lease_c = await admitted(pool, "c")
        with pytest.raises(InsufficientMemory) as refused:
            await asyncio.wait_for(lease_c, 5)
        assert refused.value.details["blocking"] == [
            {"name": "a", "charge_mib": 400, "why": "loading"}, {"name": "b", "charge_mib": 400, "why": "loading"},
        ]
        assert moves(events, "c") == []
        await asyncio.wait_for(asyncio.gather(lease_a, lease_b), 5)
        a.finish(ticket_a, 1)
        b.finish(ticket_b, 1)
    finally:
        await pool.shutdown()
