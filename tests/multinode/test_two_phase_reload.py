"""The runtime's half of a reload over several nodes: prepare checks and holds, commit swaps,
abort (or a hold that runs out) changes nothing."""
from __future__ import annotations

import asyncio
import json

import pytest

from runtime.errors import SettingsReloadAborted, SettingsReloadConflict
from tests.conftest import write_settings

MODELS = {"m": {"backend": "stub", "stub_reply": "one"}}


async def _started(runtime_service, tmp_path):
    service, _ = await runtime_service(MODELS)
    path = service.pool.settings_path
    return service, path


def _write(path, models):
    with open(path, "w") as handle:
        json.dump({"models": models}, handle)


async def test_prepare_then_commit_swaps(runtime_service, tmp_path):
    service, path = await _started(runtime_service, tmp_path)
    _write(path, {**MODELS, "n": {"backend": "stub"}})
    prepared = await service.handle("reload_prepare", {"reload_id": "r1"}, None)
    assert (prepared["added_models"], prepared["reload_id"]) == (["n"], "r1")
    assert set(service.pool.controllers) == {"m"}  # nothing swapped yet
    diff = await service.handle("reload_commit", {"reload_id": "r1"}, None)
    assert diff["added_models"] == ["n"] and set(service.pool.controllers) == {"m", "n"}


async def test_prepare_then_abort_changes_nothing_and_frees_the_reload(runtime_service, tmp_path):
    service, path = await _started(runtime_service, tmp_path)
    _write(path, {"n": {"backend": "stub"}})
    await service.handle("reload_prepare", {"reload_id": "r1"}, None)
    assert await service.handle("reload_abort", {"reload_id": "r1"}, None) == {"aborted": True}
    assert set(service.pool.controllers) == {"m"}
    with pytest.raises(SettingsReloadAborted):
        await service.handle("reload_commit", {"reload_id": "r1"}, None)
    # The hold is gone: a load and a plain reload go through.
    assert (await service.handle("load", {"name": "m", "body": {}}, None))["runtime_state"] == "loaded"
    _write(path, {**MODELS, "n": {"backend": "stub"}})
    assert (await service.handle("reload_settings", {}, None))["added_models"] == ["n"]


async def test_a_hold_that_runs_out_aborts(runtime_service, tmp_path):
    service, path = await _started(runtime_service, tmp_path)
    _write(path, {**MODELS, "n": {"backend": "stub"}})
    await service.handle("reload_prepare", {"reload_id": "r1", "hold_seconds": 0.1}, None)
    for _ in range(100):
        if "r1" not in service._prepared:
            break
        await asyncio.sleep(0.02)
    with pytest.raises(SettingsReloadAborted):
        await service.handle("reload_commit", {"reload_id": "r1"}, None)
    assert set(service.pool.controllers) == {"m"}


async def test_a_conflict_is_refused_at_prepare(runtime_service, tmp_path):
    service, path = await _started(runtime_service, tmp_path)
    await service.handle("load", {"name": "m", "body": {}}, None)
    _write(path, {"m": {"backend": "stub", "stub_reply": "two"}})
    with pytest.raises(SettingsReloadConflict):
        await service.handle("reload_prepare", {"reload_id": "r1"}, None)
    assert service._prepared == {}
    assert service.pool.controllers["m"].entry.definition.stub_reply == "one"
