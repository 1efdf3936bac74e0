"""The decisions the model writer's collaborators return, read from a fake model's record: where an
admitted request goes (leases.entry_for), what a Load does (replicas.load_gate), which stalled
engine a timeout kills (leases.stalled) and what a memory notice means (MemoryClaim.on_notice).
The writer applying them is covered by the transition sequences of test_controller, test_phases,
test_swap_groups and test_memory_placement."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from runtime.errors import InvalidLoadRequest, ModelNotLoaded, ModelStateConflict, ModelUnloading
from runtime.model import commands as cmd
from runtime.model.leases import Entry, Lease, entry_for, stalled
from runtime.model.memory_claim import MemoryClaim, MemoryStep
from runtime.model.phases import Mark, Phase, PhaseMachine
from runtime.model.replicas import LoadGate, load_gate
from runtime.model.state import REASON_REQUEST, RuntimeState

S = RuntimeState
P = Phase


class Record:
    """The fields of a model's record the decisions read."""

    def __init__(self, state: RuntimeState, phase: Phase = P.IDLE, *, idle: bool = True, pinned: bool = False,
                 memory: object | None = object()):
        self.name = "m"
        self.state = state
        self.phases = PhaseMachine("m", lambda: self.state)
        self.phases.phase = phase
        self.load_override: dict = {}
        self.replicas = 1
        self.reason = REASON_REQUEST
        self.waiters: list = []
        self.memory = memory
        self.entry = SimpleNamespace(definition=SimpleNamespace(pinned=pinned))
        self._idle = idle

    def memory_idle(self) -> bool:
        return self._idle


def test_entry_for_queues_waits_or_refuses():
    assert entry_for("m", S.LOADED, False, False) is Entry.QUEUE
    assert entry_for("m", S.LOADED, True, True) is Entry.WAIT  # the group turn is over: it waits for the next
    assert entry_for("m", S.UNLOADED, False, True) is Entry.WAIT
    with pytest.raises(ModelUnloading):
        entry_for("m", S.LOADED, True, False)
    with pytest.raises(ModelNotLoaded):
        entry_for("m", S.UNLOADED, False, False)


def test_load_gate():
    held = Record(S.UNLOADED)
    held.phases.mark(Mark.RELOAD_HELD)
    assert load_gate(held, {"n_ctx": 8}, 2) is LoadGate.HOLD
    assert load_gate(Record(S.UNLOADED), {}, None) is LoadGate.BEGIN
    assert load_gate(Record(S.FAILED), {"n_ctx": 8}, 2) is LoadGate.BEGIN
    loaded = Record(S.LOADED, P.SERVING)
    assert load_gate(loaded, {}, 1) is LoadGate.DONE
    with pytest.raises(InvalidLoadRequest):
        load_gate(loaded, {"n_ctx": 8}, None)
    with pytest.raises(InvalidLoadRequest):
        load_gate(Record(S.LOADING, P.STARTING), {}, 2)
    with pytest.raises(ModelStateConflict):
        load_gate(Record(S.UNLOADING), {}, None)


def test_stalled_is_a_stalled_engine_of_the_current_load():
    stuck, fine = SimpleNamespace(stalled=True), SimpleNamespace(stalled=False)
    assert stalled(Lease(0, stuck), [stuck])
    assert not stalled(Lease(0, fine), [fine])
    assert not stalled(Lease(0, stuck), [fine])  # an engine of an earlier load
    assert not stalled(Lease(1, stuck), [stuck])


@pytest.mark.parametrize(("record", "notice", "step"), [
    (Record(S.LOADED, P.SERVING), cmd.Notice.MEMORY_EVICT, MemoryStep.EVICT),
    (Record(S.LOADED, P.SERVING, idle=False), cmd.Notice.MEMORY_EVICT, MemoryStep.DECLINE),
    (Record(S.LOADED, P.SERVING, pinned=True), cmd.Notice.MEMORY_EVICT, MemoryStep.DECLINE),
    (Record(S.LOADING, P.STARTING, memory=None), cmd.Notice.MEMORY_EVICT, None),
    (Record(S.LOADING, P.AWAITING_MEMORY), cmd.Notice.MEMORY_READY, MemoryStep.LOAD_GOES),
    (Record(S.LOADED, P.AWAITING_MEMORY), cmd.Notice.MEMORY_READY, MemoryStep.WAKE_GOES),
    (Record(S.LOADING, P.STARTING), cmd.Notice.MEMORY_READY, None),
    (Record(S.LOADING, P.AWAITING_MEMORY), cmd.Notice.MEMORY_REPLAN, MemoryStep.REPLAN_LOAD),
    (Record(S.LOADED, P.ASLEEP), cmd.Notice.MEMORY_REPLAN, MemoryStep.REPLAN_WAKE),
    (Record(S.LOADING, P.AWAITING_MEMORY, memory=None), cmd.Notice.MEMORY_REPLAN, None),
    (Record(S.LOADED, P.SERVING), cmd.Notice.MEMORY_RELIEVE, MemoryStep.RELIEVE),
    (Record(S.LOADED, P.SERVING), cmd.Notice.MEMORY_GROW, MemoryStep.GROW),
])
def test_memory_notice_decides_a_step(record, notice, step):
    assert MemoryClaim(record).on_notice(notice) is step


def test_a_waiting_load_its_requests_left_is_unwanted():
    waiting = Record(S.LOADING, P.AWAITING_MEMORY)
    claim = MemoryClaim(waiting)
    assert claim.wait_unwanted([])
    assert not claim.wait_unwanted([object()])  # an admin caller still waits for it
    waiting.waiters.append(object())
    assert not claim.wait_unwanted([])
