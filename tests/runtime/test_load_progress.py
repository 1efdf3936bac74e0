"""Load progress (runtime.model.load_progress): the stages and fractions a load reports, in the
controller's entry, from the stub (in process and in an engine process) and SmolLM2 for real."""
from __future__ import annotations

import asyncio

import pytest

from runtime.model.load_progress import (
    STAGE_CREATING_CONTEXT,
    STAGE_ENGINE_PROCESS_STARTED,
    STAGE_LOADING_WEIGHTS,
    STAGE_STUB_LOADING,
)
from runtime.observe.read_models import model_entry
from runtime.model.replicas import load_replicas, release_replicas
from tests.engine_process.conftest import no_engine_process_left, state_dir  # noqa: F401 - fixtures
from tests.engines.runtime_driver import load, unload
from tests.llama_cpp.llama_helpers import SMOLLM2_MODEL

STUB = {"backend": "stub", "stub_load_seconds": 0.05}


async def reported(service, name: str, count: int = 1) -> list[tuple[str, float | None]]:
    """What one load of ``name`` reports through load_replicas, in order; the replicas are released."""
    progress: list[tuple[str, float | None]] = []
    entry = service.pool.controller(name).entry
    engines, _ = await load_replicas(entry, {}, count, lambda message, replica: None,
                                     on_load_progress=lambda stage, fraction: progress.append((stage, fraction)))
    assert await release_replicas(engines) == []
    return progress


async def test_a_stub_reports_ten_steps_per_replica_scaled_into_the_whole_load(runtime_service):
    service, _ = await runtime_service({"stub": STUB})
    progress = await reported(service, "stub", count=2)
    steps = [step / 10 for step in range(10)] + [1.0]
    assert progress == [(STAGE_STUB_LOADING, step / 2) for step in steps] + [
        (STAGE_STUB_LOADING, (1 + step) / 2) for step in steps
    ]


async def test_a_stub_in_an_engine_process_reports_over_frames(runtime_service):
    service, _ = await runtime_service({"stub": {**STUB, "isolation": "process"}})
    progress = await reported(service, "stub")
    assert progress == [(STAGE_ENGINE_PROCESS_STARTED, None)] + [
        (STAGE_STUB_LOADING, step / 10) for step in range(10)
    ] + [(STAGE_STUB_LOADING, 1.0)]


async def test_the_entry_shows_the_latest_progress_while_loading_and_null_after(runtime_service):
    service, _ = await runtime_service({"slow": {"backend": "stub", "stub_load_seconds": 1.0}})
    controller = service.pool.controller("slow")
    assert model_entry(controller)["load_progress"] is None
    loading = asyncio.create_task(load(service, "slow"))
    seen = []
    while not loading.done():
        progress = model_entry(controller)["load_progress"]
        if progress is not None and progress not in seen:
            seen.append(progress)
        await asyncio.sleep(0.01)
    assert (await loading)["load_progress"] is None
    assert {item["stage"] for item in seen} == {STAGE_STUB_LOADING}
    fractions = [item["fraction"] for item in seen]
    assert fractions == sorted(fractions) and len(fractions) >= 3 and fractions[-1] <= 1.0
    await unload(service, "slow")
    assert model_entry(controller)["load_progress"] is None


def check_weights_fractions(progress: list[tuple[str, float | None]]) -> None:
    weights = [fraction for stage, fraction in progress if stage == STAGE_LOADING_WEIGHTS]
    assert weights == sorted(weights) and len(weights) >= 5 and weights[-1] == 1.0
    assert all(0.0 <= fraction <= 1.0 for fraction in weights)
    assert all(b - a >= 0.01 for a, b in zip(weights, weights[1:-1]))  # steps of at least 1 %
    assert progress[-1] == (STAGE_CREATING_CONTEXT, None)


@pytest.mark.parametrize("isolation", ["process", "none"])
async def test_smollm2_reports_its_tensor_loading_fraction(runtime_service, isolation):
    service, _ = await runtime_service({"smol": {**SMOLLM2_MODEL, "isolation": isolation}})
    progress = await reported(service, "smol")
    if isolation == "process":
        assert progress[0] == (STAGE_ENGINE_PROCESS_STARTED, None)
        progress = progress[1:]
    check_weights_fractions(progress)
