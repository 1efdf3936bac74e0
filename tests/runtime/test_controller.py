"""The lifecycle writer driven in-process: exact transitions, races, graceful unload."""
import asyncio
import random

import pytest

from runtime.model import commands as cmd
from runtime.backends.stub.spec import StubEngine, StubSpec
from runtime.errors import (
    BackendError,
    InvalidLoadRequest,
    ModelFailed,
    ModelLoading,
    ModelNotLoaded,
    ModelStateConflict,
    ModelUnloading,
)
from runtime.model.tickets import Ticket
from runtime.model.state import TRANSITIONS, RuntimeState
from tests.runtime.helpers import LOAD_CYCLE, UNLOAD_CYCLE, moves, start_pool


@pytest.fixture
def engines(monkeypatch):
    """Every StubEngine the spec creates, to check what was released."""
    created: list[StubEngine] = []
    original = StubSpec.create_engine

    def spy(self, *args):
        engine = original(self, *args)
        created.append(engine)
        return engine

    monkeypatch.setattr(StubSpec, "create_engine", spy)
    return created


async def test_load_then_unload_moves_through_the_table(tmp_path, engines):
    pool, events = await start_pool(tmp_path, {"m": {"backend": "stub", "replicas": 2}})
    controller = pool.controller("m")
    await controller.load({}, None)
    assert controller.state is RuntimeState.LOADED
    assert [e.loaded for e in engines] == [True, True]
    await controller.unload()
    assert moves(events, "m") == LOAD_CYCLE + UNLOAD_CYCLE
    assert [e.loaded for e in engines] == [False, False]
    await pool.shutdown()


async def test_failed_load_keeps_last_error_until_the_next_load(tmp_path):
    pool, events = await start_pool(
        tmp_path, {"m": {"backend": "stub", "stub_fail_load": "weights are corrupt", "stub_load_seconds": 0.2}}
    )
    controller = pool.controller("m")
    await controller.load({}, None)
    assert controller.state is RuntimeState.FAILED
    assert controller.last_error == "replica 1 of 1 failed to load: weights are corrupt"
    second = asyncio.create_task(controller.load({}, None))
    await asyncio.sleep(0.05)
    assert controller.state is RuntimeState.LOADING
    assert controller.last_error is None
    await second
    assert moves(events, "m") == [("unloaded", "loading"), ("loading", "failed"), ("failed", "loading"), ("loading", "failed")]
    await pool.shutdown()


async def test_replicas_are_all_or_nothing(tmp_path, engines):
    pool, _ = await start_pool(
        tmp_path, {"m": {"backend": "stub", "replicas": 3, "stub_fail_load": "no memory", "stub_fail_replica": 1}}
    )
    controller = pool.controller("m")
    await controller.load({}, None)
    assert controller.state is RuntimeState.FAILED
    assert controller.last_error == "replica 2 of 3 failed to load: no memory"
    assert len(engines) == 2  # the third replica was never started
    assert [e.loaded for e in engines] == [False, False]  # the first one was released again
    assert controller.engines == []
    await pool.shutdown()


async def test_concurrent_loads_load_once(tmp_path, engines):
    pool, events = await start_pool(tmp_path, {"m": {"backend": "stub", "stub_load_seconds": 0.1}})
    controller = pool.controller("m")
    await asyncio.gather(*(controller.load({}, None) for _ in range(20)))
    assert moves(events, "m") == LOAD_CYCLE
    assert len(engines) == 1
    await pool.shutdown()


async def test_load_and_unload_storm_ends_in_a_legal_state(tmp_path):
    pool, events = await start_pool(
        tmp_path, {"m": {"backend": "stub", "stub_load_seconds": 0.01, "stub_unload_seconds": 0.01}}
    )
    controller = pool.controller("m")
    rng = random.Random(7)

    async def call(kind):
        await asyncio.sleep(rng.random() * 0.1)
        try:
            await (controller.load({}, None) if kind == "load" else controller.unload())
            return "ok"
        except ModelStateConflict:
            return "conflict"

    outcomes = await asyncio.wait_for(
        asyncio.gather(*(call(rng.choice(["load", "unload"])) for _ in range(100))), timeout=20
    )
    assert set(outcomes) <= {"ok", "conflict"}
    assert controller.state in (RuntimeState.LOADED, RuntimeState.UNLOADED)
    previous = "unloaded"
    for old, new in moves(events, "m"):
        assert old == previous and RuntimeState(new) in TRANSITIONS[RuntimeState(old)]
        previous = new
    assert previous == controller.state.value
    await pool.shutdown()


async def test_requests_are_rejected_in_every_state_but_loaded(tmp_path):
    pool, _ = await start_pool(tmp_path, {
        "m": {"backend": "stub", "stub_load_seconds": 0.3},
        "broken": {"backend": "stub", "stub_fail_load": "nope"},
    })
    controller = pool.controller("m")
    with pytest.raises(ModelNotLoaded):
        await controller.admit(Ticket("r1", None))
    loading = asyncio.create_task(controller.load({}, None))
    await asyncio.sleep(0.05)
    with pytest.raises(ModelLoading):
        await controller.admit(Ticket("r2", None))
    await loading
    await pool.controller("broken").load({}, None)
    with pytest.raises(ModelFailed, match="model broken failed; an operator can see why in its last_error") as failed:
        await pool.controller("broken").admit(Ticket("r3", None))
    assert "nope" not in failed.value.message and "nope" in pool.controller("broken").last_error
    await pool.shutdown()


async def test_graceful_unload_rejects_queued_and_waits_for_active(tmp_path):
    pool, events = await start_pool(tmp_path, {"m": {"backend": "stub"}})
    controller = pool.controller("m")
    await controller.load({}, None)
    active = Ticket("active", None)
    queued = Ticket("queued", "k")
    assert (await (await controller.admit(active))).replica == 0
    queued_dispatch = await controller.admit(queued)
    unloading = asyncio.create_task(controller.unload())
    await asyncio.sleep(0.05)
    assert controller.state is RuntimeState.UNLOADING
    with pytest.raises(ModelUnloading):
        await queued_dispatch
    with pytest.raises(ModelUnloading):
        await controller.admit(Ticket("late", None))
    assert not unloading.done()
    controller.finish(queued)
    controller.finish(active)
    await asyncio.wait_for(unloading, 2)
    assert moves(events, "m") == LOAD_CYCLE + UNLOAD_CYCLE
    await pool.shutdown()


async def test_overrides_only_change_while_unloaded_or_failed(tmp_path):
    pool, _ = await start_pool(tmp_path, {"m": {"backend": "stub", "replicas": 1, "replica_max": 3}})
    controller = pool.controller("m")
    await controller.load({}, 2)
    assert controller.replicas == 2 and len(controller.engines) == 2
    await controller.load({}, None)  # idempotent
    await controller.load({}, 2)  # same selection: idempotent
    with pytest.raises(InvalidLoadRequest):
        await controller.load({}, 3)
    assert controller.replicas == 2 and controller.state is RuntimeState.LOADED
    await controller.unload()
    assert controller.replicas == 1
    with pytest.raises(InvalidLoadRequest, match="replica_max"):
        await controller.load({}, 4)
    with pytest.raises(InvalidLoadRequest, match="target_inflight"):
        await controller.load({"target_inflight": 2}, None)
    assert controller.state is RuntimeState.UNLOADED
    await pool.shutdown()


async def test_unload_while_loading_and_load_while_unloading_conflict(tmp_path):
    pool, _ = await start_pool(tmp_path, {"m": {"backend": "stub", "stub_load_seconds": 0.2, "stub_unload_seconds": 0.2}})
    controller = pool.controller("m")
    loading = asyncio.create_task(controller.load({}, None))
    await asyncio.sleep(0.05)
    with pytest.raises(ModelStateConflict):
        await controller.unload()
    await loading
    unloading = asyncio.create_task(controller.unload())
    await asyncio.sleep(0.05)
    with pytest.raises(ModelStateConflict):
        await controller.load({}, None)
    await controller.unload()  # already unloading: returns at once
    await unloading
    assert controller.state is RuntimeState.UNLOADED
    await pool.shutdown()


async def test_enabled_models_load_in_the_background_at_start(tmp_path):
    pool, events = await start_pool(tmp_path, {
        "on": {"backend": "stub", "enabled": True, "stub_load_seconds": 0.2},
        "off": {"backend": "stub"},
    })
    assert pool.controller("on").state is RuntimeState.UNLOADED or pool.controller("on").state is RuntimeState.LOADING
    await asyncio.sleep(0.4)
    assert pool.controller("on").state is RuntimeState.LOADED
    assert pool.controller("off").state is RuntimeState.UNLOADED
    await pool.shutdown()


async def test_an_engine_that_dies_while_loaded_fails_the_model(tmp_path, engines):
    pool, events = await start_pool(tmp_path, {"m": {"backend": "stub"}})
    controller = pool.controller("m")
    await controller.load({}, None)
    running, waiting = Ticket("running", None), Ticket("waiting", None)
    await (await controller.admit(running))
    queued = await controller.admit(waiting)
    controller.engine_failed("server exited with code -9")
    with pytest.raises(BackendError, match="model m failed while loaded; an operator can see why in its last_error"):
        await queued
    await asyncio.sleep(0.05)
    assert controller.state is RuntimeState.FAILED
    assert controller.last_error == "server exited with code -9"
    assert engines[0].loaded is False and controller.engines == []
    controller.finish(running, 3)  # the dead request ends later; nothing breaks
    await controller.load({}, None)
    assert moves(events, "m") == LOAD_CYCLE + [("loaded", "failed")] + [("failed", "loading"), ("loading", "loaded")]
    await pool.shutdown()


async def test_an_admission_the_idle_writer_would_take_next_is_answered_in_the_callers_step(tmp_path):
    """With nothing queued, the caller's task admits itself (no hop to the writer task and back):
    the answer is there before the caller's step ends, and a free slot is already leased."""
    pool, _ = await start_pool(tmp_path, {"m": {"backend": "stub"}})
    controller = pool.controller("m")
    await controller.load({}, None)
    ticket = Ticket("now", None)
    admitted = controller._post(cmd.Admit(ticket))
    assert admitted.done()
    dispatched = admitted.result()
    assert dispatched.done() and dispatched.result().replica == 0
    controller.finish(ticket)
    await pool.shutdown()


async def test_an_admission_behind_a_queued_command_waits_its_turn(tmp_path):
    """A command already in the writer's inbox (here an unload) is handled first: the admission
    posted after it is refused as the unload's state says, not admitted ahead of it."""
    pool, _ = await start_pool(tmp_path, {"m": {"backend": "stub"}})
    controller = pool.controller("m")
    await controller.load({}, None)
    unloading = controller._post(cmd.Unload())
    admitted = controller._post(cmd.Admit(Ticket("late", None)))
    assert not admitted.done()  # queued behind the unload
    with pytest.raises((ModelUnloading, ModelNotLoaded)):
        await admitted
    await unloading
    assert controller.state is RuntimeState.UNLOADED
    await pool.shutdown()


async def test_a_finish_reaches_the_writer_on_the_next_turn_of_the_loop(tmp_path):
    """``finish`` is posted on the loop's next turn, so work the request's task does right after it
    (sending the answer) comes first; then the slot is given back as before."""
    pool, _ = await start_pool(tmp_path, {"m": {"backend": "stub"}})
    controller = pool.controller("m")
    await controller.load({}, None)
    ticket = Ticket("done", None)
    await (await controller.admit(ticket))
    assert controller.scheduler.inflight == 1
    controller.finish(ticket, 3)
    assert controller._inbox.empty() and controller.scheduler.inflight == 1
    for _ in range(5):
        await asyncio.sleep(0)
    assert controller.scheduler.inflight == 0
    await pool.shutdown()
