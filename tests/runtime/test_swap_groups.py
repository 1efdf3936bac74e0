"""Swap groups in-process: slots, LRU victims, busy members kept, turns, pins, keep_warm, reload.

Stub models with load and token delays; the exact transitions of every member, with reasons.
"""
import asyncio
import itertools
import json
import time

import pytest

from runtime.config import validate_settings
from runtime.errors import InvalidSettings, ModelLoading, SettingsReloadConflict
from runtime.pool.model_pool import ModelPool
from runtime.observe.read_models import model_entry
from runtime.model.state import RuntimeState
from tests.conftest import write_settings
from tests.engines.runtime_driver import user_input

S = RuntimeState
_ids = itertools.count()
SLOW = " ".join(f"w{i}" for i in range(10))


def member(**fields) -> dict:
    return {"backend": "stub", "stub_reply": "a b c", "load_on_request": True, **fields}


def steps(events, model: str) -> list[tuple[str, str, str | None]]:
    return [(e.old.value, e.new.value, e.reason) for e in events if e.model == model]


def timeline(events) -> list[tuple[str, str, str]]:
    """(model, to, reason) of every transition, in order."""
    return [(e.model, e.new.value, e.reason) for e in events]


def load_steps(reason: str) -> list[tuple[str, str, str]]:
    return [("unloaded", "loading", reason), ("loading", "loaded", reason)]


def unload_steps(reason: str) -> list[tuple[str, str, str]]:
    return [("loaded", "unloading", reason), ("unloading", "unloaded", reason)]


async def generate(service, model: str) -> dict:
    async def emit(event: dict) -> None:
        pass

    payload = {"request_id": f"g{next(_ids)}", "model": model, "messages": user_input("hi")}
    return await service.handle("generate", payload, emit)


async def until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


@pytest.fixture
async def group_service(tmp_path):
    """Factory: ``await group_service(models, groups)`` -> (a started RuntimeService, its events)."""
    from runtime.service import RuntimeService

    started = []

    async def start(models: dict, groups: dict, *, load_enabled: bool = False):
        path = write_settings(tmp_path / f"s{len(started)}", models)
        data = json.loads(path.read_text())
        data["groups"] = groups
        path.write_text(json.dumps(data))
        service = RuntimeService(str(path))
        events: list = []
        service.pool.listeners.append(events.append)
        await service.start(load_enabled=load_enabled)
        started.append(service)
        return service, events

    yield start
    for service in started:
        await service.shutdown()


async def test_a_request_for_another_member_swaps_the_idle_one_out_first(group_service):
    service, events = await group_service(
        {"a": member(stub_unload_seconds=0.2), "b": member(stub_load_seconds=0.1)},
        {"g": {"members": ["a", "b"], "max_loaded": 1}},
    )
    await generate(service, "a")
    assert (await generate(service, "b"))["text"] == "a b c"
    assert steps(events, "a") == load_steps("request") + unload_steps("group_swap")
    assert steps(events, "b") == load_steps("request")
    # b waits in loading for a's slot: it loads only once a is unloaded
    order = timeline(events)
    assert order.index(("a", "unloaded", "group_swap")) < order.index(("b", "loaded", "request"))
    assert service.pool.groups["g"].swaps == 1
    assert model_entry(service.pool.controller("b"))["group"] == "g"


async def test_a_busy_member_is_not_chosen_while_an_idle_one_exists(group_service):
    service, events = await group_service(
        {"a": member(stub_reply=SLOW, stub_token_delay_ms=100), "b": member(), "c": member()},
        {"g": {"members": ["a", "b", "c"], "max_loaded": 2}},
    )
    busy = asyncio.create_task(generate(service, "a"))  # a is used first: the least recently used
    await until(lambda: service.pool.controller("a").scheduler.inflight == 1)
    await generate(service, "c")
    await generate(service, "b")
    assert (await busy)["text"] == SLOW  # never cut
    assert steps(events, "a") == load_steps("request")
    assert steps(events, "c") == load_steps("request") + unload_steps("group_swap")
    assert steps(events, "b") == load_steps("request")


async def test_when_every_member_is_busy_the_load_waits_until_one_drains(group_service):
    service, events = await group_service(
        {"a": member(stub_reply=SLOW, stub_token_delay_ms=80), "b": member()},
        {"g": {"members": ["a", "b"], "max_loaded": 1}},
    )
    busy = asyncio.create_task(generate(service, "a"))
    await until(lambda: service.pool.controller("a").scheduler.inflight == 1)
    b = await generate(service, "b")
    assert b["text"] == "a b c"
    assert (await busy)["text"] == SLOW
    order = timeline(events)
    assert order.index(("a", "unloading", "group_swap")) > order.index(("b", "loading", "request"))
    assert steps(events, "a") == load_steps("request") + unload_steps("group_swap")


async def test_a_busy_member_gives_up_its_slot_after_max_turn_seconds(group_service):
    """a has work all the time; b still gets the slot once a's turn (1 s) is over, and the a
    requests that come after the end of its turn wait for its next one: none fails."""
    service, events = await group_service(
        {"a": member(stub_token_delay_ms=50, stub_reply="x y"), "b": member()},
        {"g": {"members": ["a", "b"], "max_loaded": 1, "max_turn_seconds": 1}},
    )
    await generate(service, "a")
    stop = asyncio.Event()
    served = []

    async def hammer():
        while not stop.is_set():
            served.append((await generate(service, "a"))["text"])

    clients = [asyncio.create_task(hammer()) for _ in range(2)]
    await asyncio.sleep(0.3)
    started = time.monotonic()
    assert (await asyncio.wait_for(generate(service, "b"), 10))["text"] == "a b c"
    waited = time.monotonic() - started
    stop.set()
    await asyncio.gather(*clients)
    assert 0.6 <= waited < 4, waited
    assert served and set(served) == {"x y"}
    assert steps(events, "a")[:4] == load_steps("request") + unload_steps("group_swap")
    assert steps(events, "a")[4:6] == load_steps("request")  # a's next turn


async def test_a_pinned_member_is_never_swapped_out(group_service):
    service, events = await group_service(
        {"a": member(pinned=True), "b": member(load_wait_timeout_seconds=0.5)},
        {"g": {"members": ["a", "b"], "max_loaded": 1}},
    )
    await generate(service, "a")
    with pytest.raises(ModelLoading):
        await generate(service, "b")
    await until(lambda: service.pool.controller("b").state is S.UNLOADED)
    # b's load waited for a slot and was withdrawn when its only request gave up
    assert steps(events, "b") == [("unloaded", "loading", "request"), ("loading", "unloaded", "request")]
    assert steps(events, "a") == load_steps("request")


async def test_an_admin_load_of_a_member_follows_the_same_rules(group_service):
    service, events = await group_service(
        {"a": member(), "b": {"backend": "stub"}},
        {"g": {"members": ["a", "b"], "max_loaded": 1}},
    )
    await generate(service, "a")
    entry = await service.handle("load", {"name": "b", "body": None}, None)
    assert entry["runtime_state"] == "loaded"
    assert steps(events, "a") == load_steps("request") + unload_steps("group_swap")
    assert steps(events, "b") == load_steps("admin")


async def test_keep_warm_brings_a_preloaded_member_back_when_the_group_is_free(group_service):
    service, events = await group_service(
        {"small": member(enabled=True, keep_warm=True), "big": member(ttl_seconds=1)},
        {"g": {"members": ["small", "big"], "max_loaded": 1}},
        load_enabled=True,
    )
    small = service.pool.controller("small")
    await until(lambda: small.state is S.LOADED)
    await generate(service, "big")
    await until(lambda: small.state is S.LOADED and service.pool.controller("big").state is S.UNLOADED, timeout=8)
    assert steps(events, "small") == load_steps("startup") + unload_steps("group_swap") + load_steps("keep_warm")
    assert steps(events, "big") == load_steps("request") + unload_steps("ttl")
    # an admin unload is the operator's word: it does not come back
    await service.handle("unload", {"name": "small"}, None)
    await service.handle("load", {"name": "big", "body": None}, None)
    await service.handle("unload", {"name": "big"}, None)
    await asyncio.sleep(0.3)
    assert small.state is S.UNLOADED


async def test_without_keep_warm_a_swapped_out_preload_stays_unloaded(group_service):
    service, events = await group_service(
        {"small": member(enabled=True), "big": member(ttl_seconds=1)},
        {"g": {"members": ["small", "big"], "max_loaded": 1}},
        load_enabled=True,
    )
    await until(lambda: service.pool.controller("small").state is S.LOADED)
    await generate(service, "big")
    await until(lambda: service.pool.controller("big").state is S.UNLOADED, timeout=8)
    await asyncio.sleep(0.3)
    assert steps(events, "small") == load_steps("startup") + unload_steps("group_swap")


@pytest.mark.parametrize(
    "groups,path",
    [
        ({"g": {"members": ["a", "nope"]}}, "$.groups.g.members[1]"),
        ({"g": {"members": ["a"]}, "h": {"members": ["a", "b"]}}, "$.groups.h.members[0]"),
        ({"g": {"members": ["a", "b"], "max_loaded": 1}}, "$.groups.g.max_loaded"),
        ({"g": {"members": ["a"], "max_loaded": 0}}, "$.groups.g.max_loaded"),
        ({"g": {"members": []}}, "$.groups.g.members"),
    ],
)
def test_groups_are_checked_with_the_settings(groups, path):
    models = {"a": {"backend": "stub", "enabled": True}, "b": {"backend": "stub", "enabled": True}}
    with pytest.raises(InvalidSettings) as raised:
        validate_settings({"models": models, "groups": groups})
    assert path in [problem["path"] for problem in raised.value.details]


async def test_a_reload_that_changes_a_group_in_use_is_refused(tmp_path):
    models = {"a": member(), "b": member()}
    path = write_settings(tmp_path, models)
    data = json.loads(path.read_text())
    data["groups"] = {"g": {"members": ["a", "b"], "max_loaded": 1}}
    path.write_text(json.dumps(data))
    pool = ModelPool(str(path))
    await pool.start()
    await pool.controller("a").load({}, None)
    data["groups"]["g"]["max_loaded"] = 2
    path.write_text(json.dumps(data))
    with pytest.raises(SettingsReloadConflict, match="group g"):
        await pool.reload()
    data["groups"]["g"]["max_turn_seconds"] = 5  # only the turn: fine while in use
    data["groups"]["g"]["max_loaded"] = 1
    path.write_text(json.dumps(data))
    await pool.reload()
    assert pool.groups["g"].settings.max_turn_seconds == 5
    assert pool.controller("a").group is pool.groups["g"]
    await pool.controller("a").unload()
    data["groups"]["g"]["max_loaded"] = 2
    path.write_text(json.dumps(data))
    await pool.reload()
    assert pool.groups["g"].settings.max_loaded == 2
    await pool.shutdown()


async def test_interleaved_traffic_from_eight_clients_is_served_grouped_without_a_failure(group_service):
    """Eight clients for 30 s, each asking the three members of a max_loaded 1 group in turn
    (a b c a b c ...), each waiting for its answer: nothing fails, a busy member is never
    swapped out, and a turn ends only once its member has drained, so each turn serves every
    request waiting for it.  In this closed loop that bounds the swaps by the served requests
    over the clients (plus one per member to settle); naive FIFO would swap on most requests."""
    models = {name: member(stub_load_seconds=0.05, stub_token_delay_ms=5) for name in ("a", "b", "c")}
    service, events = await group_service(models, {"g": {"members": ["a", "b", "c"], "max_loaded": 1}})
    clients, duration = 8, 30.0
    stop_at = time.monotonic() + duration
    served, failures = [], []

    async def client(offset: int):
        names = ["a", "b", "c"]
        turn = offset
        while time.monotonic() < stop_at:
            name = names[turn % 3]
            turn += 1
            try:
                served.append((name, (await generate(service, name))["text"]))
            except Exception as exc:  # any failure is the test's failure
                failures.append(repr(exc))

    await asyncio.gather(*(client(i) for i in range(clients)))
    assert failures == []
    assert served and {text for _, text in served} == {"a b c"}
    swaps = service.pool.groups["g"].swaps
    assert 0 < swaps <= len(served) / clients + 3, (swaps, len(served))
    assert len([e for e in events if e.reason == "group_swap" and e.new is S.UNLOADING]) == swaps
