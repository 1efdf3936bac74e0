"""POST /v1/admin/settings/reload, ``manage.py reload_settings``, invalid settings at start-up,
local.json merging and the SQLite catalog mirror, against real processes.

Most tests share one service: the ``baseline`` fixture unloads every model,
rewrites the baseline settings.json (no local.json) and reloads before each test.
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from tests.conftest import ROOT, LiveService, catalog_mirror as mirror, write_settings

BASELINE = {
    "service": {"log_level": "info"},
    "engine": {"decoding": {"max_output_tokens": 64}, "fairness": {"per_key_queue_limit": 8}},
    "models": {
        "alpha": {"backend": "stub", "stub_reply": "alpha says hi"},
        "beta": {"backend": "stub", "stub_token_delay_ms": 1},
        "gamma": {"backend": "stub"},
        "slowpoke": {"backend": "stub", "stub_load_seconds": 1.5, "stub_unload_seconds": 1.5},
        "fragile": {"backend": "stub", "stub_fail_load": "bad weights"},
    },
}


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    folder = tmp_path_factory.mktemp("reload")
    settings_path = write_settings(folder, BASELINE["models"], service=BASELINE["service"], engine=BASELINE["engine"])
    live = LiveService(settings_path, folder / "db.sqlite3").start()
    yield live
    assert live.stop() == 0


@pytest.fixture
def http(service, baseline):
    with service.client(timeout=15) as client:
        yield client


@pytest.fixture
def baseline(service):
    """Every model unloaded, the baseline files in place and reloaded."""
    with service.client(timeout=15) as client:
        for model in client.get("/v1/admin/models").json()["models"]:
            settle(client, model["name"])
            if model["runtime_state"] != "failed":
                assert client.post(f"/v1/admin/models/{model['name']}/unload").status_code == 200
        local = service.settings_path.parent / "local.json"
        local.unlink(missing_ok=True)
        service.settings_path.write_text(json.dumps(BASELINE))
        assert client.post("/v1/admin/settings/reload").status_code == 200


def settle(client: httpx.Client, name: str) -> None:
    deadline = time.monotonic() + 10
    while entries(client).get(name, {}).get("runtime_state") in ("loading", "unloading"):
        assert time.monotonic() < deadline, f"{name} never settled"
        time.sleep(0.02)


def entries(client: httpx.Client) -> dict[str, dict]:
    return {m["name"]: m for m in client.get("/v1/admin/models").json()["models"]}


def edited(change) -> dict:
    """A deep copy of the baseline settings with ``change(settings)`` applied."""
    settings = copy.deepcopy(BASELINE)
    change(settings)
    return settings


def write(service: LiveService, settings: dict) -> None:
    service.settings_path.write_text(json.dumps(settings))


def reload(client: httpx.Client) -> httpx.Response:
    return client.post("/v1/admin/settings/reload")


def assert_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error"}
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    return error


# ---- the diff ----------------------------------------------------------------------------


def test_reload_reports_added_removed_updated_and_unchanged_models(service, http):
    def change(settings):
        models = settings["models"]
        del models["gamma"]
        models["beta"]["stub_reply"] = "new reply"
        models["delta"] = {"backend": "stub", "enabled": True}

    write(service, edited(change))
    answer = reload(http)
    assert answer.status_code == 200
    assert answer.json() == {
        "added_models": ["delta"],
        "removed_models": ["gamma"],
        "updated_models": ["beta"],
        "unchanged_models": ["alpha", "fragile", "slowpoke"],
        "service_restart_required": False,
    }
    time.sleep(0.3)  # a start-up style load of delta (stub_load_seconds 0) would be done by now
    models = entries(http)
    assert set(models) == {"alpha", "beta", "delta", "fragile", "slowpoke"}
    assert (models["delta"]["runtime_state"], models["delta"]["configured_enabled"]) == ("unloaded", True)
    assert models["beta"]["definition"]["stub_reply"] == "new reply"


def test_reload_of_unchanged_files_reports_everything_unchanged(service, http):
    before = entries(http)
    answer = reload(http)
    assert answer.json() == {
        "added_models": [],
        "removed_models": [],
        "updated_models": [],
        "unchanged_models": sorted(BASELINE["models"]),
        "service_restart_required": False,
    }
    assert entries(http) == before


def test_an_updated_model_serves_its_new_definition(service, http):
    write(service, edited(lambda s: s["models"]["alpha"].update(stub_reply="fresh words")))
    assert reload(http).json()["updated_models"] == ["alpha"]
    assert http.post("/v1/admin/models/alpha/load").json()["runtime_state"] == "loaded"
    answer = http.post("/v1/responses", json={"model": "alpha", "input": "x"})
    assert answer.json()["output"][0]["content"][0]["text"] == "fresh words"


def test_a_removed_model_is_unknown_afterwards(service, http):
    write(service, edited(lambda s: s["models"].pop("gamma")))
    assert reload(http).json()["removed_models"] == ["gamma"]
    assert_error(http.post("/v1/admin/models/gamma/load"), 404, "unknown_model")
    assert_error(http.post("/v1/responses", json={"model": "gamma", "input": "x"}), 404, "unknown_model")


# ---- 409 settings_reload_conflict --------------------------------------------------------


def test_changing_a_loaded_model_conflicts_and_applies_nothing(service, http):
    assert http.post("/v1/admin/models/alpha/load").json()["runtime_state"] == "loaded"
    before = entries(http)

    def change(settings):
        settings["models"]["alpha"]["stub_reply"] = "changed"
        settings["models"]["delta"] = {"backend": "stub"}  # would be added; must not be
        settings["models"]["beta"]["stub_reply"] = "also changed"  # would be updated; must not be

    write(service, edited(change))
    error = assert_error(reload(http), 409, "settings_reload_conflict")
    assert "alpha" in error["message"]
    assert entries(http) == before
    answer = http.post("/v1/responses", json={"model": "alpha", "input": "x"})
    assert answer.json()["output"][0]["content"][0]["text"] == "alpha says hi"


def test_removing_a_loaded_model_conflicts(service, http):
    assert http.post("/v1/admin/models/gamma/load").json()["runtime_state"] == "loaded"
    before = entries(http)
    write(service, edited(lambda s: s["models"].pop("gamma")))
    error = assert_error(reload(http), 409, "settings_reload_conflict")
    assert "gamma" in error["message"]
    assert entries(http) == before


@pytest.mark.parametrize("state", ["loading", "unloading"])
def test_changing_a_model_in_transition_conflicts(service, http, state):
    if state == "unloading":
        assert http.post("/v1/admin/models/slowpoke/load").json()["runtime_state"] == "loaded"
    action = "load" if state == "loading" else "unload"
    with ThreadPoolExecutor(1) as pool, service.client(timeout=15) as actor:
        moving = pool.submit(actor.post, f"/v1/admin/models/slowpoke/{action}")
        deadline = time.monotonic() + 5
        while entries(http)["slowpoke"]["runtime_state"] != state:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        write(service, edited(lambda s: s["models"]["slowpoke"].update(stub_reply="changed")))
        error = assert_error(reload(http), 409, "settings_reload_conflict")
        assert "slowpoke" in error["message"]
        assert entries(http)["slowpoke"]["definition"]["stub_reply"] is None
        assert moving.result().status_code == 200


def test_changing_only_enabled_on_a_loaded_model_is_allowed(service, http):
    assert http.post("/v1/admin/models/alpha/load").json()["runtime_state"] == "loaded"
    write(service, edited(lambda s: s["models"]["alpha"].update(enabled=True)))
    answer = reload(http)
    assert answer.status_code == 200
    assert answer.json()["updated_models"] == ["alpha"]
    alpha = entries(http)["alpha"]
    assert (alpha["runtime_state"], alpha["configured_enabled"], alpha["definition"]["enabled"]) == (
        "loaded", True, True
    )
    assert http.post("/v1/responses", json={"model": "alpha", "input": "x"}).status_code == 200


@pytest.mark.parametrize(
    "section, change",
    [("decoding", {"temperature": 0.1}), ("fairness", {"per_key_queue_limit": 9})],
)
def test_changing_the_engine_while_a_model_is_active_conflicts(service, http, section, change):
    assert http.post("/v1/admin/models/beta/load").json()["runtime_state"] == "loaded"
    write(service, edited(lambda s: s["engine"][section].update(change)))
    error = assert_error(reload(http), 409, "settings_reload_conflict")
    assert section in error["message"]


def test_changing_the_engine_with_no_active_model_applies_at_once(service, http):
    write(service, edited(lambda s: s["engine"]["decoding"].update(max_output_tokens=2)))
    answer = reload(http)
    assert answer.status_code == 200
    assert answer.json()["unchanged_models"] == sorted(BASELINE["models"])
    assert http.post("/v1/admin/models/beta/load").json()["runtime_state"] == "loaded"
    reply = http.post("/v1/responses", json={"model": "beta", "input": "one two three four"}).json()
    assert reply["output"][0]["content"][0]["text"] == "one two"
    assert (reply["status"], reply["usage"]["output_tokens"]) == ("incomplete", 2)


def test_a_failed_model_may_change_and_then_loads(service, http):
    failed = http.post("/v1/admin/models/fragile/load").json()
    assert (failed["runtime_state"], failed["last_error"]) == ("failed", "replica 1 of 1 failed to load: bad weights")
    write(service, edited(lambda s: s["models"]["fragile"].update(stub_fail_load=None)))
    answer = reload(http)
    assert answer.json()["updated_models"] == ["fragile"]
    loaded = http.post("/v1/admin/models/fragile/load").json()
    assert (loaded["runtime_state"], loaded["last_error"]) == ("loaded", None)


# ---- 400 invalid_settings ----------------------------------------------------------------


@pytest.mark.parametrize(
    "content, expected",
    [
        ('{"models": {"alpha": ', "invalid JSON"),
        ('["not", "an", "object"]', "object"),
        (json.dumps(edited(lambda s: s["models"]["beta"].update(stub_token_delay_ms=-1))),
         "$.models.beta.stub_token_delay_ms"),
        (json.dumps(edited(lambda s: s["models"]["beta"].update(stub_colour="red"))), "$.models.beta.stub_colour"),
        (json.dumps(edited(lambda s: s["models"]["beta"].update(backend="warp_drive"))), "$.models.beta"),
        (json.dumps(edited(lambda s: s["engine"]["decoding"].update(top_p=0))), "$.engine.decoding.top_p"),
        (json.dumps(edited(lambda s: s["models"].update({"bad name!": {"backend": "stub"}}))), "bad name!"),
    ],
    ids=["broken-json", "not-an-object", "out-of-range", "unknown-field", "unknown-backend", "engine", "model-name"],
)
def test_invalid_settings_are_400_and_leave_the_catalog_unchanged(service, http, content, expected):
    before, rows_before = entries(http), mirror(service)

    # A valid change travels in the same file: nothing of it may be applied.
    service.settings_path.write_text(content)
    error = assert_error(reload(http), 400, "invalid_settings")
    assert expected in error["message"]
    assert entries(http) == before
    assert mirror(service) == rows_before


def test_an_invalid_local_json_is_400_too(service, http):
    before = entries(http)
    (service.settings_path.parent / "local.json").write_text('{"models": {"alpha": {"stub_reply": 5}}}')
    error = assert_error(reload(http), 400, "invalid_settings")
    assert "$.models.alpha.stub_reply" in error["message"]
    assert entries(http) == before


# ---- service section ---------------------------------------------------------------------


def test_a_service_change_needs_a_restart_and_still_reloads_the_catalog(service, http):
    def change(settings):
        settings["service"]["log_level"] = "debug"
        settings["models"]["delta"] = {"backend": "stub"}

    write(service, edited(change))
    answer = reload(http)
    assert answer.status_code == 200
    assert answer.json()["service_restart_required"] is True
    assert answer.json()["added_models"] == ["delta"]
    assert "delta" in entries(http)
    # Back to the settings the process started with: no restart needed any more.
    write(service, BASELINE)
    assert reload(http).json()["service_restart_required"] is False


def test_a_service_change_does_not_block_a_reload_while_models_are_loaded(service, http):
    assert http.post("/v1/admin/models/alpha/load").json()["runtime_state"] == "loaded"
    write(service, edited(lambda s: s["service"].update(port=9999)))
    answer = reload(http)
    assert answer.status_code == 200
    assert answer.json()["service_restart_required"] is True
    assert entries(http)["alpha"]["runtime_state"] == "loaded"


# ---- local.json ------------------------------------------------------------------------


def test_local_json_deep_merges_and_removes_models_on_reload(service, http):
    local = {"models": {"beta": {"stub_reply": "from local"}, "gamma": None, "epsilon": {"backend": "stub"}}}
    (service.settings_path.parent / "local.json").write_text(json.dumps(local))
    answer = reload(http)
    assert answer.status_code == 200
    body = answer.json()
    assert (body["added_models"], body["removed_models"], body["updated_models"]) == (["epsilon"], ["gamma"], ["beta"])
    beta = entries(http)["beta"]["definition"]
    assert beta["stub_reply"] == "from local"
    assert beta["stub_token_delay_ms"] == 1  # kept from settings.json: objects merge key by key
    rows = mirror(service)
    assert rows["beta"][3] == ["settings.json", "local.json"]
    assert rows["epsilon"][3] == ["local.json"]
    assert rows["alpha"][3] == ["settings.json"]
    assert "gamma" not in rows


def test_local_json_is_merged_at_start_up(live_service):
    service = live_service(
        {
            "kept": {"backend": "stub", "stub_reply": "base", "stub_token_delay_ms": 3},
            "dropped": {"backend": "stub"},
        },
        local={"models": {"kept": {"stub_reply": "local"}, "dropped": None}},
    )
    with service.client() as client:
        models = entries(client)
    assert set(models) == {"kept"}
    definition = models["kept"]["definition"]
    assert (definition["stub_reply"], definition["stub_token_delay_ms"]) == ("local", 3)
    # The mirror is written at start-up: one row, the merged definition, both source files.
    assert mirror(service) == {"kept": ("stub", False, definition, ["settings.json", "local.json"])}


# ---- the catalog mirror ------------------------------------------------------------------


def test_the_catalog_mirror_has_one_row_per_model_after_a_reload(service, http):
    rows = mirror(service)
    models = entries(http)
    assert set(rows) == set(models)
    for name, (backend, enabled, definition, sources) in rows.items():
        assert backend == models[name]["resolved_backend"]
        assert enabled is models[name]["configured_enabled"]
        assert definition == models[name]["definition"]
        assert sources == ["settings.json"]

    def change(settings):
        del settings["models"]["gamma"]
        settings["models"]["beta"]["enabled"] = True
        settings["models"]["delta"] = {"backend": "stub", "stub_reply": "d"}

    write(service, edited(change))
    assert reload(http).status_code == 200
    rows = mirror(service)
    assert set(rows) == {"alpha", "beta", "delta", "fragile", "slowpoke"}
    assert rows["beta"][1] is True and rows["beta"][2]["enabled"] is True
    assert rows["delta"][2]["stub_reply"] == "d"


def test_a_rejected_reload_leaves_the_mirror_unchanged(service, http):
    assert http.post("/v1/admin/models/alpha/load").json()["runtime_state"] == "loaded"
    rows = mirror(service)
    write(service, edited(lambda s: (s["models"].pop("alpha"), s["models"].pop("beta"))))
    assert_error(reload(http), 409, "settings_reload_conflict")
    assert mirror(service) == rows


# ---- manage.py reload_settings -----------------------------------------------------------


def run_manage(service: LiveService, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT, env=service.env, capture_output=True, text=True, timeout=timeout,
    )


def test_reload_settings_command_prints_the_result_and_exits_0(service, http):
    write(service, edited(lambda s: s["models"].update(delta={"backend": "stub"})))
    done = run_manage(service, "reload_settings", "--url", service.url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "added_models": ["delta"],
        "removed_models": [],
        "updated_models": [],
        "unchanged_models": sorted(BASELINE["models"]),
        "service_restart_required": False,
    }
    assert "delta" in entries(http)


def test_reload_settings_command_with_a_broken_file_exits_non_zero(service, http):
    before = entries(http)
    write(service, edited(lambda s: s["models"]["beta"].update(stub_token_delay_ms="slow")))
    done = run_manage(service, "reload_settings", "--url", service.url)
    assert done.returncode != 0
    assert done.stderr.startswith("invalid_settings: ")
    assert "$.models.beta.stub_token_delay_ms" in done.stderr
    assert "Traceback" not in done.stderr
    assert entries(http) == before


def test_reload_settings_command_reports_a_conflict(service, http):
    assert http.post("/v1/admin/models/alpha/load").json()["runtime_state"] == "loaded"
    write(service, edited(lambda s: s["models"]["alpha"].update(stub_reply="changed")))
    done = run_manage(service, "reload_settings", "--url", service.url)
    assert done.returncode != 0
    assert json.loads(done.stdout)["error"]["code"] == "settings_reload_conflict"


# ---- invalid settings at start-up --------------------------------------------------------


@pytest.mark.parametrize(
    "models, path",
    [
        ({"x": {"backend": "stub", "stub_token_delay_ms": -5}}, "$.models.x.stub_token_delay_ms"),
        ({"x": {"backend": "exllamav3"}}, "$.models.x"),
        ({"x": {"backend": "stub", "replicas": 3, "replica_max": 2}}, "$.models.x"),
    ],
    ids=["out-of-range", "missing-model-path", "replicas-over-max"],
)
def test_start_up_exits_non_zero_on_invalid_settings(tmp_path, api_shape, models, path):
    """``serve`` on the embedded default, the runtime worker (``manage.py runtime``) on the split."""
    settings_path = write_settings(tmp_path, models)
    service = LiveService(settings_path, tmp_path / "db.sqlite3")
    command = ["serve", "--port", str(service.port)] if service.mode == "embedded" else ["runtime"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *command],
        cwd=ROOT, env=service.env, capture_output=True, text=True, timeout=20,
    )
    assert done.returncode != 0
    assert "invalid_settings" in done.stderr
    assert path in done.stderr
