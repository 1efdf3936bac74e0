"""The writer's sub-phases (runtime.model.phases): the table and its checks, then the phases a real
writer moves through (stub models): a load that waits for its group's slot, one that waits for
memory, a sleep and a wake, an unload."""
from __future__ import annotations

import asyncio
import json

import pytest

from runtime.model.phases import PHASE_MOVES, IllegalPhase, Mark, Phase, PhaseMachine
from runtime.model.tickets import Ticket
from runtime.model.state import RuntimeState
from runtime.pool.model_pool import ModelPool
from tests.conftest import write_settings
from tests.engines.test_gpu import FakeNvml, install_nvml
from tests.runtime.test_swap_groups import SLOW, member, until

S = RuntimeState
P = Phase


class Held:
    """A lifecycle state to hold a ``PhaseMachine`` against."""

    def __init__(self, state: RuntimeState):
        self.state = state


def machine(state: RuntimeState, phase: Phase = P.IDLE) -> tuple[PhaseMachine, Held]:
    held = Held(state)
    phases = PhaseMachine("m", lambda: held.state)
    phases.phase = phase
    return phases, held


def test_every_phase_has_moves_and_states():
    assert set(PHASE_MOVES) == set(Phase)
    assert all(phase.states for phase in Phase)
    # Every phase but idle may end in idle: an unload, a failure, a withdrawn load.
    assert all(P.IDLE in PHASE_MOVES[phase] for phase in Phase if phase is not P.IDLE)


@pytest.mark.parametrize(
    "state,old,new",
    [(S.LOADING, P.IDLE, P.SERVING), (S.LOADED, P.STARTING, P.OPERATING), (S.LOADING, P.SERVING, P.STARTING),
     (S.LOADED, P.AWAITING_SLOT, P.SERVING), (S.LOADED, P.ASLEEP, P.SERVING), (S.LOADED, P.OPERATING, P.WAKING)],
)
def test_a_move_the_table_lacks_raises_and_changes_nothing(state, old, new):
    phases, _ = machine(state, old)
    with pytest.raises(IllegalPhase):
        phases.move(old, new)
    assert phases.phase is old


@pytest.mark.parametrize(
    "state,old,new",
    [(S.UNLOADED, P.IDLE, P.STARTING), (S.LOADING, P.STARTING, P.IDLE), (S.LOADING, P.AWAITING_MEMORY, P.WAKING),
     (S.LOADED, P.AWAITING_MEMORY, P.AWAITING_SLOT)],
)
def test_a_legal_move_into_a_phase_the_state_does_not_hold_raises(state, old, new):
    phases, _ = machine(state, old)
    assert new in PHASE_MOVES[old]
    with pytest.raises(IllegalPhase, match=f"{old.label} -> {new.label}"):
        phases.move(old, new)
    assert phases.phase is old


def test_the_expected_phase_must_be_the_current_one():
    phases, _ = machine(S.LOADING, P.AWAITING_SLOT)
    with pytest.raises(IllegalPhase):
        phases.move(P.AWAITING_MEMORY, P.STARTING)
    phases.move(frozenset({P.AWAITING_MEMORY, P.AWAITING_SLOT}), P.STARTING)
    assert phases.phase is P.STARTING


def test_marks_are_set_only_in_the_states_they_declare_and_cleared_in_any():
    phases, held = machine(S.UNLOADED)
    with pytest.raises(IllegalPhase):
        phases.mark(Mark.YIELDING)
    with pytest.raises(IllegalPhase):
        phases.mark(Mark.SWAPPED_OUT)
    phases.mark(Mark.RELOAD_HELD)
    held.state = S.LOADED
    phases.mark(Mark.YIELDING)
    phases.mark(Mark.SWAPPED_OUT)
    assert all(phases.has(mark) for mark in Mark)
    held.state = S.FAILED
    for mark in Mark:
        phases.clear(mark)
    assert not any(phases.has(mark) for mark in Mark)


async def test_a_sleep_and_a_wake_move_a_loaded_model_between_serving_and_asleep(tmp_path, monkeypatch):
    install_nvml(monkeypatch, FakeNvml([]))
    path = tmp_path / "settings.json"
    models = {"sleepy": {"backend": "stub", "device": "cpu", "stub_vram_mib": 300, "stub_sleep_mib": 50}}
    path.write_text(json.dumps({"models": models, "memory": {"devices": {"cpu": {"budget_mib": 500}}}}))
    pool = ModelPool(str(path))
    await pool.start(load_enabled=False)
    sleepy = pool.controller("sleepy")
    try:
        assert (sleepy.state, sleepy.phases.phase) == (S.UNLOADED, P.IDLE)
        await sleepy.load({}, None)
        assert (sleepy.state, sleepy.phases.phase, sleepy.residency) == (S.LOADED, P.SERVING, "active")
        await sleepy.sleep()
        assert (sleepy.phases.phase, sleepy.residency) == (P.ASLEEP, "sleeping")
        await sleepy.wake()
        assert (sleepy.phases.phase, sleepy.residency) == (P.SERVING, "active")
        await sleepy.unload()
        assert (sleepy.state, sleepy.phases.phase) == (S.UNLOADED, P.IDLE)
    finally:
        await pool.shutdown()


async def test_a_load_that_waits_for_memory_is_awaiting_memory_then_withdrawn(tmp_path, monkeypatch):
    """A request-triggered load that only a busy model blocks waits in ``awaiting_memory``; its
    request gone, the load is withdrawn (loading -> unloaded) and the phase is idle again."""
    install_nvml(monkeypatch, FakeNvml([]))
    path = tmp_path / "settings.json"
    busy = {"backend": "stub", "device": "cpu", "stub_vram_mib": 400, "stub_reply": SLOW, "stub_token_delay_ms": 80}
    wanted = {"backend": "stub", "device": "cpu", "stub_vram_mib": 300, "load_on_request": True}
    memory = {"devices": {"cpu": {"budget_mib": 500}}, "eviction": "idle_lru"}
    path.write_text(json.dumps({"models": {"busy": busy, "wanted": wanted}, "memory": memory}))
    pool = ModelPool(str(path))
    await pool.start(load_enabled=False)
    try:
        holder, waiter = pool.controller("busy"), pool.controller("wanted")
        await holder.load({}, None)
        running = Ticket("running", None)
        await (await holder.admit(running))
        ticket = Ticket("waits", None)
        admitted = asyncio.create_task(waiter.admit(ticket))
        await until(lambda: waiter.state is S.LOADING)
        assert waiter.phases.phase is P.AWAITING_MEMORY and waiter.memory_view()["awaiting_memory"]
        admitted.cancel()
        await until(lambda: waiter.state is S.UNLOADED)
        assert waiter.phases.phase is P.IDLE and not waiter.memory_view()["awaiting_memory"]
        holder.finish(running, 1)
    finally:
        await pool.shutdown()


async def test_a_load_that_waits_for_its_groups_slot_is_awaiting_slot_then_starting(tmp_path):
    """``b`` wants the one slot ``a`` holds while ``a`` is busy: ``awaiting_slot``; once ``a``
    drains the group swaps it out (``idle`` again) and ``b`` starts, then serves."""
    path = write_settings(tmp_path, {"a": member(), "b": member(stub_load_seconds=0.3)})
    data = json.loads(path.read_text())
    data["groups"] = {"g": {"members": ["a", "b"], "max_loaded": 1}}
    path.write_text(json.dumps(data))
    pool = ModelPool(str(path))
    await pool.start(load_enabled=False)
    a, b = pool.controller("a"), pool.controller("b")
    try:
        await a.load({}, None)
        busy = Ticket("busy", None)
        await (await a.admit(busy))
        wanted = Ticket("wanted", None)
        admitted = asyncio.create_task(b.admit(wanted))
        await until(lambda: b.state is S.LOADING)
        assert b.phases.phase is P.AWAITING_SLOT
        a.finish(busy, 1)
        await until(lambda: b.phases.phase is P.STARTING)
        assert a.state in (S.UNLOADING, S.UNLOADED) and a.phases.phase is P.IDLE
        await (await admitted)
        assert (b.state, b.phases.phase) == (S.LOADED, P.SERVING)
        b.finish(wanted, 1)
    finally:
        await pool.shutdown()
