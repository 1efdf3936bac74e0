"""The decisions the model writer's collaborators return, read from a fake model's record: where an
admitted request goes (leases.entry_for), what a Load does (replicas.load_gate), which stalled
engine a timeout kills (leases.stalled), what a memory notice means (MemoryClaim.on_notice) and
what a reconfigure, sleep or wake does next (Operations' OpStep).
The writer applying them is covered by the transition sequences of test_controller, test_phases,
test_swap_groups and test_memory_placement."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from runtime.errors import BackendError, InvalidLoadRequest, ModelNotLoaded, ModelStateConflict, ModelUnloading
from runtime.model import commands as cmd
from runtime.model.leases import Entry, Lease, entry_for, stalled
from runtime.model.memory_claim import MemoryClaim, MemoryStep
from runtime.model.operations import RUNNING, Operations, OpStep
from runtime.model.phases import Mark, Phase, PhaseMachine
from runtime.model.replicas import LoadGate, load_gate
from runtime.model.residency import Operation
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


class Operated(Record):
    """A loaded model's record as the operations read it: its queue, engines and residency."""

    def __init__(self, phase: Phase, *, inflight: int = 0, queued: int = 0):
        super().__init__(S.LOADED, phase, memory=None)
        self.scheduler = SimpleNamespace(inflight=inflight, queue_depth=queued)
        self.serving_engines = [object()]
        self.placement = None

    @property
    def residency(self) -> str:
        return "sleeping" if self.phases.phase is P.ASLEEP else "active"


def operations_of(model: Operated, operation: Operation | None = None) -> Operations:
    posted: list = []
    operations = Operations(model, SimpleNamespace(), posted.append)
    operations.current = operation
    return operations


def test_an_operation_runs_once_its_model_is_idle_and_changes_nothing_itself():
    sleep = Operation("sleep", "admin", P.SERVING)
    busy = Operated(P.OPERATING, inflight=1)
    assert operations_of(busy, sleep).when_idle() is None  # it waits for the active request
    idle = Operated(P.OPERATING)
    step = operations_of(idle, sleep).when_idle()
    assert step == OpStep(run=sleep)
    assert idle.phases.phase is P.OPERATING and sleep.task is None  # the writer starts the run


async def test_a_finished_sleep_decides_the_move_the_event_and_the_reopening():
    caller = asyncio.get_running_loop().create_future()
    sleep = Operation("sleep", "admin", P.SERVING, [caller])
    model = Operated(P.OPERATING)
    operations = operations_of(model, sleep)
    step = operations.finished(sleep, None, None)
    assert step.move == (RUNNING, P.ASLEEP) and step.event.kind == "slept" and not step.resume
    assert step.then == operations.reopen
    assert model.phases.phase is P.OPERATING  # not moved: the writer applies the step
    assert operations.current is None and caller.result()["reason"] == "admin"
    model.phases.phase = P.ASLEEP
    assert operations.reopen() is None  # asleep with nothing queued: the queue stays paused
    model.phases.phase = P.SERVING
    assert operations.reopen() == OpStep(resume=True)


async def test_a_failed_reconfigure_goes_back_and_reports_an_engine_failure_unless_rolled_back():
    model = Operated(P.OPERATING)
    broken = Operation("reconfigure", "admin", P.SERVING, [asyncio.get_running_loop().create_future()])
    step = operations_of(model, broken).finished(broken, RuntimeError("boom"), None)
    assert step.move == (RUNNING, P.SERVING) and step.failed == "reconfigure failed: boom"
    assert step.reconfigured is None and step.event is None
    with pytest.raises(BackendError):
        broken.callers[0].result()
    rolled_back = Operation("reconfigure", "admin", P.SERVING, [asyncio.get_running_loop().create_future()])
    step = operations_of(model, rolled_back).finished(rolled_back, InvalidLoadRequest("no"), None)
    assert step.move == (RUNNING, P.SERVING) and step.failed is None
    with pytest.raises(InvalidLoadRequest):
        rolled_back.callers[0].result()
