"""Models that switch by themselves, in-process: load on request, the idle TTL, pins, aliases.

Stub models with load and unload delays give exact sequences; every transition's reason is
asserted with it.
"""
import asyncio
import itertools
import time

import pytest

from runtime.config import validate_settings
from runtime.errors import InvalidSettings, ModelFailed, ModelLoading, ModelNotLoaded, ModelUnloading, UnknownModel
from runtime.observe.read_models import model_entry
from runtime.model.state import RuntimeState
from tests.engines.runtime_driver import user_input

S = RuntimeState
_ids = itertools.count()


def steps(events, model: str) -> list[tuple[str, str, str | None]]:
    """(from, to, reason) of every transition of ``model``."""
    return [(e.old.value, e.new.value, e.reason) for e in events if e.model == model]


def load_steps(reason: str) -> list[tuple[str, str, str]]:
    return [("unloaded", "loading", reason), ("loading", "loaded", reason)]


def unload_steps(reason: str) -> list[tuple[str, str, str]]:
    return [("loaded", "unloading", reason), ("unloading", "unloaded", reason)]


def on_demand(**fields) -> dict:
    return {"backend": "stub", "stub_reply": "a b c", "load_on_request": True, **fields}


async def generate(service, model: str, *, stream: bool = False, seen: list | None = None, key=None) -> dict:
    async def emit(event: dict) -> None:
        if seen is not None:
            seen.append(event["event"])

    payload = {"request_id": f"r{next(_ids)}", "model": model, "messages": user_input("hi"), "stream": stream,
               "fairness_key": key}
    return await service.handle("generate", payload, emit)


async def until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_racing_requests_start_one_load_and_all_get_answered(runtime_service):
    service, events = await runtime_service({"m": on_demand(stub_load_seconds=0.3)})
    # four fairness keys: 25 queued each, within the per-key queue limit (64) once the load is done
    results = await asyncio.gather(*(generate(service, "m", key=f"k{i % 4}") for i in range(100)))
    assert [r["text"] for r in results] == ["a b c"] * 100
    assert steps(events, "m") == load_steps("request")


async def test_a_streamed_request_hears_that_it_waits_before_it_is_admitted(runtime_service):
    service, _ = await runtime_service({"m": on_demand(stub_load_seconds=0.2)})
    first, second = [], []
    await generate(service, "m", stream=True, seen=first)
    await generate(service, "m", stream=True, seen=second)
    assert first == ["waiting", "admitted", "delta", "delta", "delta"]
    assert second == ["admitted", "delta", "delta", "delta"]  # loaded already: no wait


async def test_requests_for_a_model_loading_by_admin_wait_for_that_load(runtime_service):
    service, events = await runtime_service({"m": on_demand(stub_load_seconds=0.3), "plain": {
        "backend": "stub", "stub_load_seconds": 0.3}})
    admin = asyncio.create_task(service.handle("load", {"name": "m", "body": None}, None))
    plain = asyncio.create_task(service.handle("load", {"name": "plain", "body": None}, None))
    await until(lambda: service.pool.controller("plain").state is S.LOADING)
    with pytest.raises(ModelLoading):  # the contract's default is unchanged without load_on_request
        await generate(service, "plain")
    result = await generate(service, "m")
    await asyncio.gather(admin, plain)
    assert result["text"] == "a b c"
    assert steps(events, "m") == load_steps("admin")


async def test_the_wait_is_bounded_by_load_wait_timeout_seconds(runtime_service):
    service, events = await runtime_service({"m": on_demand(stub_load_seconds=1.5, load_wait_timeout_seconds=0.3)})
    controller = service.pool.controller("m")
    started = time.monotonic()
    with pytest.raises(ModelLoading) as raised:
        await generate(service, "m")
    assert 0.3 <= time.monotonic() - started < 1.2
    assert raised.value.http_status == 503 and raised.value.retry_after == 5
    assert "load_wait_timeout_seconds=0.3" in raised.value.message
    await until(lambda: len(controller.waiters) == 0)  # the timed-out request holds nothing
    await until(lambda: controller.state is S.LOADED)
    assert (await generate(service, "m"))["text"] == "a b c"
    assert steps(events, "m") == load_steps("request")


async def test_a_failed_load_answers_every_waiter_and_is_not_retried_by_requests(runtime_service):
    service, events = await runtime_service({"m": on_demand(stub_load_seconds=0.2, stub_fail_load="weights missing")})
    results = await asyncio.gather(*(generate(service, "m") for _ in range(5)), return_exceptions=True)
    assert all(isinstance(r, ModelFailed) for r in results), results
    # Each waiter learns where the reason is; the reason is the operator's (last_error).
    assert all(r.message.startswith("model m failed; an operator can see why in its last_error") for r in results)
    assert "weights missing" in service.pool.controller("m").last_error
    assert steps(events, "m") == [("unloaded", "loading", "request"), ("loading", "failed", "request")]
    with pytest.raises(ModelFailed, match="model m failed"):
        await generate(service, "m")
    assert len(steps(events, "m")) == 2  # no new load: an admin load is needed


async def test_without_load_on_request_an_unloaded_model_is_still_refused(runtime_service):
    service, events = await runtime_service({"m": {"backend": "stub"}})
    with pytest.raises(ModelNotLoaded):
        await generate(service, "m")
    assert events == []


async def test_a_request_that_goes_away_while_waiting_leaves_nothing_behind(runtime_service):
    service, _ = await runtime_service({"m": on_demand(stub_load_seconds=0.5)})
    controller = service.pool.controller("m")
    waiting = asyncio.create_task(generate(service, "m"))
    await until(lambda: len(controller.waiters) == 1)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    await until(lambda: len(controller.waiters) == 0)
    await until(lambda: controller.state is S.LOADED)
    assert controller.scheduler.inflight == 0 and controller.scheduler.queue_depth == 0


async def test_startup_and_admin_transitions_carry_their_reason(tmp_path):
    from tests.runtime.helpers import start_pool

    pool, events = await start_pool(tmp_path, {"m": {"backend": "stub", "enabled": True}})
    controller = pool.controller("m")
    await until(lambda: controller.state is S.LOADED)
    await controller.unload()
    await controller.load({}, None)
    assert steps(events, "m") == load_steps("startup") + unload_steps("admin") + load_steps("admin")
    await pool.shutdown()


# ---- the idle TTL ---------------------------------------------------------------------------


async def test_ttl_unloads_an_idle_model_and_a_request_resets_the_clock(runtime_service):
    service, events = await runtime_service({"m": on_demand(ttl_seconds=1)})
    controller = service.pool.controller("m")
    await generate(service, "m")
    await until(lambda: model_entry(controller)["idle_expires_at"] is not None)  # the finish is posted
    entry = model_entry(controller)
    assert entry["last_request_at"] is not None
    assert entry["definition"]["ttl_seconds"] == 1
    await asyncio.sleep(0.6)
    await generate(service, "m")  # resets the clock
    last = time.monotonic()
    await until(lambda: controller.state is S.UNLOADED, timeout=5)
    assert time.monotonic() - last >= 0.95
    assert steps(events, "m") == load_steps("request") + unload_steps("ttl")
    assert model_entry(controller)["idle_expires_at"] is None


async def test_a_request_during_the_ttl_drain_waits_and_loads_the_model_again(runtime_service):
    service, events = await runtime_service({"m": on_demand(ttl_seconds=1, stub_unload_seconds=0.6)})
    controller = service.pool.controller("m")
    await generate(service, "m")
    await until(lambda: controller.state is S.UNLOADING, timeout=5)
    result = await asyncio.wait_for(generate(service, "m"), 5)  # never a hang
    assert result["text"] == "a b c"
    assert steps(events, "m") == load_steps("request") + unload_steps("ttl") + load_steps("request")


async def test_without_load_on_request_a_request_during_the_ttl_drain_gets_model_unloading(runtime_service):
    service, events = await runtime_service({"m": {"backend": "stub", "ttl_seconds": 1, "stub_unload_seconds": 0.6}})
    controller = service.pool.controller("m")
    await service.handle("load", {"name": "m", "body": None}, None)
    await until(lambda: controller.state is S.UNLOADING, timeout=5)
    with pytest.raises(ModelUnloading):
        await asyncio.wait_for(generate(service, "m"), 2)
    await until(lambda: controller.state is S.UNLOADED)
    assert steps(events, "m") == load_steps("admin") + unload_steps("ttl")


async def test_an_admin_unload_refuses_requests_even_with_load_on_request(runtime_service):
    service, events = await runtime_service({"m": on_demand(stub_unload_seconds=0.5)})
    controller = service.pool.controller("m")
    await generate(service, "m")
    unload = asyncio.create_task(service.handle("unload", {"name": "m"}, None))
    await until(lambda: controller.state is S.UNLOADING)
    with pytest.raises(ModelUnloading):
        await generate(service, "m")
    await unload
    assert steps(events, "m") == load_steps("request") + unload_steps("admin")
    assert (await generate(service, "m"))["text"] == "a b c"  # unloaded: a request loads it again


async def test_a_pinned_model_ignores_its_ttl(runtime_service):
    service, events = await runtime_service({"m": on_demand(ttl_seconds=1, pinned=True)})
    controller = service.pool.controller("m")
    await generate(service, "m")
    await until(lambda: controller.scheduler.inflight == 0)
    assert model_entry(controller)["idle_expires_at"] is None
    await asyncio.sleep(1.4)
    assert controller.state is S.LOADED
    await service.handle("unload", {"name": "m"}, None)  # only an admin unload takes it away
    assert steps(events, "m") == load_steps("request") + unload_steps("admin")


# ---- aliases ---------------------------------------------------------------------------------


async def test_an_alias_reaches_its_model(runtime_service):
    service, events = await runtime_service({"m": on_demand(aliases=["gpt-4o-mini", "small"])})
    assert (await generate(service, "gpt-4o-mini"))["text"] == "a b c"
    assert (await generate(service, "small"))["text"] == "a b c"
    assert steps(events, "m") == load_steps("request")
    assert service.pool.lookup("small") is service.pool.controller("m")
    with pytest.raises(UnknownModel):
        await generate(service, "other")
    with pytest.raises(UnknownModel):  # admin operations take model names only
        await service.handle("get_model", {"name": "small"}, None)


@pytest.mark.parametrize(
    "models,path",
    [
        ({"a": {"backend": "stub", "aliases": ["b"]}, "b": {"backend": "stub"}}, "$.models.a.aliases[0]"),
        ({"a": {"backend": "stub", "aliases": ["x"]}, "b": {"backend": "stub", "aliases": ["x"]}},
         "$.models.b.aliases[0]"),
        ({"a": {"backend": "stub", "aliases": ["x", "x"]}}, "$.models.a.aliases[1]"),
        ({"a": {"backend": "stub", "aliases": ["bad name"]}}, "$.models.a.aliases[0]"),
    ],
)
def test_aliases_must_be_unique_and_distinct_from_model_names(models, path):
    with pytest.raises(InvalidSettings) as raised:
        validate_settings({"models": models})
    assert raised.value.code == "invalid_settings"
    assert path in [problem["path"] for problem in raised.value.details]
