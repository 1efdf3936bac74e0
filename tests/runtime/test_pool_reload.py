"""Settings reload: the diff, the conflict rules, and atomicity (all or nothing)."""
import asyncio
import json

import pytest

from runtime.errors import InvalidSettings, SettingsReloadConflict, UnknownModel
from runtime.model.state import RuntimeState
from tests.runtime.helpers import start_pool


def rewrite(pool, models, **sections):
    with open(pool.settings_path, "w") as handle:
        json.dump({"models": models, **sections}, handle)


def snapshot(pool):
    return {name: c.entry for name, c in pool.controllers.items()}, pool.current


async def test_reload_reports_added_removed_updated_unchanged(tmp_path):
    pool, _ = await start_pool(tmp_path, {
        "same": {"backend": "stub"}, "changed": {"backend": "stub"}, "gone": {"backend": "stub"},
    })
    rewrite(pool, {
        "same": {"backend": "stub"}, "changed": {"backend": "stub", "stub_reply": "new"},
        "fresh": {"backend": "stub", "enabled": True},
    })
    diff = await pool.reload()
    assert diff == {
        "added_models": ["fresh"], "removed_models": ["gone"], "updated_models": ["changed"],
        "unchanged_models": ["same"], "service_restart_required": False,
    }
    assert pool.controller("fresh").state is RuntimeState.UNLOADED  # enabled does not load on reload
    assert pool.controller("changed").entry.definition.stub_reply == "new"
    with pytest.raises(UnknownModel):
        pool.controller("gone")
    await pool.shutdown()


async def test_changing_an_active_model_is_a_conflict_and_changes_nothing(tmp_path):
    pool, _ = await start_pool(tmp_path, {"busy": {"backend": "stub"}, "idle": {"backend": "stub"}})
    await pool.controller("busy").load({}, None)
    before = snapshot(pool)
    rewrite(pool, {"busy": {"backend": "stub", "stub_reply": "x"}, "idle": {"backend": "stub", "stub_reply": "y"},
                   "extra": {"backend": "stub"}})
    with pytest.raises(SettingsReloadConflict, match="busy"):
        await pool.reload()
    assert snapshot(pool) == before
    assert "extra" not in pool.controllers
    rewrite(pool, {"idle": {"backend": "stub"}})
    with pytest.raises(SettingsReloadConflict, match="removed"):
        await pool.reload()
    assert snapshot(pool) == before
    await pool.shutdown()


async def test_changing_only_enabled_on_a_loaded_model_is_allowed(tmp_path):
    pool, _ = await start_pool(tmp_path, {"m": {"backend": "stub"}})
    await pool.controller("m").load({}, None)
    rewrite(pool, {"m": {"backend": "stub", "enabled": True}})
    diff = await pool.reload()
    assert diff["updated_models"] == ["m"]
    assert pool.controller("m").state is RuntimeState.LOADED
    assert pool.controller("m").entry.definition.enabled is True
    await pool.shutdown()


async def test_engine_changes_conflict_only_while_a_model_is_active(tmp_path):
    pool, _ = await start_pool(tmp_path, {"m": {"backend": "stub", "stub_load_seconds": 0.3}})
    loading = asyncio.create_task(pool.controller("m").load({}, None))
    await asyncio.sleep(0.05)
    rewrite(pool, {"m": {"backend": "stub", "stub_load_seconds": 0.3}}, engine={"fairness": {"per_key_queue_limit": 2}})
    with pytest.raises(SettingsReloadConflict, match="engine"):
        await pool.reload()
    await loading
    await pool.controller("m").unload()
    diff = await pool.reload()
    assert diff["unchanged_models"] == ["m"]
    assert pool.settings.engine.fairness.per_key_queue_limit == 2
    assert pool.controller("m").scheduler.fairness.per_key_queue_limit == 2
    await pool.shutdown()


async def test_invalid_settings_leave_the_catalog_unchanged(tmp_path):
    pool, _ = await start_pool(tmp_path, {"m": {"backend": "stub"}})
    before = snapshot(pool)
    rewrite(pool, {"m": {"backend": "stub", "replicas": -1}, "n": {"backend": "stub"}})
    with pytest.raises(InvalidSettings, match=r"\$\.models\.m\.replicas"):
        await pool.reload()
    with open(pool.settings_path, "w") as handle:
        handle.write("{not json")
    with pytest.raises(InvalidSettings, match="invalid JSON"):
        await pool.reload()
    assert snapshot(pool) == before
    await pool.shutdown()


async def test_service_changes_require_a_restart_but_do_not_block(tmp_path):
    pool, _ = await start_pool(tmp_path, {"m": {"backend": "stub"}})
    await pool.controller("m").load({}, None)
    rewrite(pool, {"m": {"backend": "stub"}}, service={"port": 9999})
    diff = await pool.reload()
    assert diff["service_restart_required"] is True
    assert pool.controller("m").state is RuntimeState.LOADED
    await pool.shutdown()


async def test_api_key_weights_join_the_fairness_weights_and_need_a_restart(tmp_path):
    def keys(weight):
        return {"api_keys": [{"name": "bob", "key_sha256": "0" * 64, "models": "*", "fairness_key": "team-b",
                              "weight": weight}]}

    fairness = {"fairness": {"weights": {"carol": 2}}}
    pool, _ = await start_pool(tmp_path, {"m": {"backend": "stub"}}, service=keys(3), engine=fairness)
    assert pool.controller("m").scheduler.fairness.weights == {"carol": 2, "team-b": 3}
    rewrite(pool, {"m": {"backend": "stub"}}, service=keys(5), engine={"fairness": {"weights": {"carol": 4}}})
    diff = await pool.reload()
    assert diff["service_restart_required"] is True
    assert pool.controller("m").scheduler.fairness.weights == {"carol": 4, "team-b": 3}
    await pool.shutdown()


async def test_removing_a_model_fails_its_pending_commands(tmp_path):
    pool, _ = await start_pool(tmp_path, {"m": {"backend": "stub"}, "other": {"backend": "stub"}})
    controller = pool.controller("m")
    rewrite(pool, {"other": {"backend": "stub"}})
    await pool.reload()
    with pytest.raises(UnknownModel):
        await asyncio.wait_for(controller.load({}, None), 1)
    await pool.shutdown()


async def test_a_load_that_lands_during_a_reload_waits_and_uses_the_new_definition(tmp_path, monkeypatch):
    """The writer voted "updated" on an unloaded model; a load posted after that vote waits for
    the swap, so the model never loads the definition the reload replaced."""
    pool, _ = await start_pool(tmp_path, {"m": {"backend": "stub", "stub_reply": "old"}})
    controller = pool.controller("m")
    rewrite(pool, {"m": {"backend": "stub", "stub_reply": "new"}})
    landed = []
    plan = pool._plan_reload

    def plan_with_a_load_in_between(*args):
        landed.append(controller.begin_load())  # posted after every vote, before the commit
        return plan(*args)

    monkeypatch.setattr(pool, "_plan_reload", plan_with_a_load_in_between)
    diff = await pool.reload()
    assert diff["updated_models"] == ["m"]
    await asyncio.wait_for(landed[0], 2)
    assert controller.state is RuntimeState.LOADED
    assert [engine.config["stub_reply"] for engine in controller.engines] == ["new"]
    await pool.shutdown()


async def test_a_load_held_by_a_refused_reload_runs_once_the_reload_is_refused(tmp_path, monkeypatch):
    pool, _ = await start_pool(tmp_path, {"busy": {"backend": "stub"}, "m": {"backend": "stub"}})
    await pool.controller("busy").load({}, None)
    rewrite(pool, {"busy": {"backend": "stub", "stub_reply": "x"}, "m": {"backend": "stub"}})
    landed = []
    plan = pool._plan_reload

    def plan_with_a_load_in_between(*args):
        landed.append(pool.controller("m").begin_load())
        return plan(*args)

    monkeypatch.setattr(pool, "_plan_reload", plan_with_a_load_in_between)
    with pytest.raises(SettingsReloadConflict, match="busy"):
        await pool.reload()
    await asyncio.wait_for(landed[0], 2)
    assert pool.controller("m").state is RuntimeState.LOADED
    await pool.shutdown()
