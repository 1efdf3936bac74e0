"""Relief before eviction in the plan (runtime.pool.memory ``_make_room``), with stub models on a cpu
budget whose writers' ``memory_relief`` is set per test: shrinks first, then sleeps (a model's
sleep takes its shrink's place), least recently used first in each round; what relief cannot
free is evicted from the other models; all of it evicted when that is not enough either."""
from __future__ import annotations

import json

import pytest

from runtime.pool.model_pool import ModelPool
from tests.engines.test_gpu import FakeNvml, install_nvml

MEMORY = {"devices": {"cpu": {"budget_mib": 500}}, "eviction": "idle_lru"}
SHRINK_A = {"action": "shrink", "frees_mib": 30, "to": {"gguf_n_ctx": 512}}
SLEEP_A = {"action": "sleep", "frees_mib": 80}
SLEEP_B = {"action": "sleep", "frees_mib": 70}


def stub(mib: int, **fields) -> dict:
    return {"backend": "stub", "device": "cpu", "stub_vram_mib": mib, **fields}


@pytest.fixture
async def pool(tmp_path, monkeypatch):
    install_nvml(monkeypatch, FakeNvml([]))
    models = {"a": stub(100), "b": stub(100), "c": stub(100)}
    models.update({f"new{mib}": stub(mib) for mib in (220, 260, 320, 400, 460)})
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"models": models, "memory": MEMORY}))
    pool = ModelPool(str(path))
    await pool.start(load_enabled=False)
    for name in ("a", "b", "c"):  # a is the least recently used
        await pool.controller(name).load({}, None)
    options = {"a": [SHRINK_A, SLEEP_A], "b": [SLEEP_B], "c": []}
    for name, given in options.items():
        monkeypatch.setattr(pool.controller(name), "memory_relief", lambda device, given=given: list(given),
                            raising=False)
    try:
        yield pool
    finally:
        await pool.shutdown()


def plan(pool, name: str):
    found = pool.controller(name).plan_load({}, 1, "admin")
    return found.action, [(item["name"], item["action"]) for item in found.relieve], found.evict


@pytest.mark.parametrize("loader, expected", [
    ("new220", ("evict", [("a", "shrink")], [])),  # 20 MiB short: a's shrink is enough
    ("new260", ("evict", [("a", "sleep")], [])),  # 60 short: a's sleep in place of its shrink
    ("new320", ("evict", [("a", "sleep"), ("b", "sleep")], [])),  # 120 short: both sleep
    ("new400", ("evict", [("a", "sleep"), ("b", "sleep")], ["c"])),  # 200 short: and c goes
    ("new460", ("evict", [], ["a", "b", "c"])),  # 260 short: relief cannot help, all three go
])
def test_the_cheapest_steps_come_first(pool, loader, expected):
    assert plan(pool, loader) == expected


def test_a_plan_item_says_what_it_frees_and_to_what(pool):
    found = pool.controller("new220").plan_load({}, 1, "admin")
    assert found.relieve == [{"name": "a", **SHRINK_A}]
    assert found.to_dict()["relieve"] == found.relieve


def test_a_model_whose_relief_failed_is_not_asked_again(pool):
    pool.memory.unrelievable.add("a")
    assert plan(pool, "new220") == ("evict", [("b", "sleep")], [])


def test_without_eviction_nothing_is_relieved(pool):
    pool.memory.settings.eviction = "none"
    assert plan(pool, "new220")[:2] == ("refuse", [])
