"""A managed server (the fake vllm) killed while it serves a stream and while it loads."""
from __future__ import annotations

import json
import os
import signal
import threading

import httpx

from tests.managed.helpers import TARGET, alive, output_text, pidfiles, wait_until


def fake_vllm(fake_bin, folder, **env) -> dict:
    return {
        "backend": "vllm_serve",
        "vllm_serve_model": TARGET,
        "vllm_serve_binary": str(fake_bin / "vllm"),
        "vllm_serve_env": {"FAKE_RECORD": str(folder / "vllm.jsonl"), **env},
        "vllm_serve_startup_timeout_seconds": 30.0,
    }


def entry(http: httpx.Client, name: str) -> dict:
    return next(model for model in http.get("/v1/admin/models").json()["models"] if model["name"] == name)


def configured(http: httpx.Client) -> dict:
    """What the operator configured: every model's definition as the admin API lists it."""
    return {model["name"]: model["definition"] for model in http.get("/v1/admin/models").json()["models"]}


def test_a_server_killed_mid_stream_ends_the_stream_with_an_error_and_a_load_recovers(live_service, fake_bin,
                                                                                        tmp_path):
    # 40 words at 100 ms each: the stream is still running when the server dies.
    models = {"m": fake_vllm(fake_bin, tmp_path, FAKE_TOKEN_DELAY_MS="100")}
    service = live_service(models, env={"LLMPOOL_STATE_DIR": str(tmp_path / "state")})
    with service.client() as http:
        before = configured(http)
        assert http.post("/v1/admin/models/m/load").json()["runtime_state"] == "loaded"
        [record] = pidfiles(tmp_path / "state")
        body = {"model": "m", "input": " ".join(f"w{i}" for i in range(40)), "stream": True}
        events = []
        with http.stream("POST", "/v1/responses", json=body) as stream:
            assert stream.status_code == 200
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line.removeprefix("data: ")))
                    if len(events) == 4:  # the stream has begun: kill its server
                        os.kill(record["pid"], signal.SIGKILL)
        types = [event["type"] for event in events]
        assert "response.output_text.delta" in types
        assert types[-1] in ("response.failed", "error"), types[-3:]
        assert "response.completed" not in types
        failed = wait_until(lambda: (e := entry(http, "m"))["runtime_state"] == "failed" and e, 10, message="failed")
        assert "exited with code -9" in failed["last_error"]
        assert configured(http) == before  # nothing configured is lost
        assert http.post("/v1/admin/models/m/load").json()["runtime_state"] == "loaded"
        assert output_text(http.post("/v1/responses", json={"model": "m", "input": "again"}).json()) == "echo: again"
    assert service.stop() == 0


def test_a_server_killed_while_loading_fails_the_load_and_a_new_load_recovers(live_service, fake_bin, tmp_path):
    models = {"m": fake_vllm(fake_bin, tmp_path, FAKE_READY_AFTER="30")}  # /health answers 503 for 30 s
    state = tmp_path / "state"
    service = live_service(models, env={"LLMPOOL_STATE_DIR": str(state)})
    with service.client() as http:
        before = configured(http)
        answer: list[httpx.Response] = []
        loader = threading.Thread(target=lambda: answer.append(http.post("/v1/admin/models/m/load")))
        loader.start()
        [record] = wait_until(lambda: pidfiles(state), 15, message="the server spawned")
        wait_until(lambda: entry(http, "m")["runtime_state"] == "loading", 5, message="loading")
        os.kill(record["pid"], signal.SIGKILL)
        loader.join(timeout=20)
        assert not loader.is_alive(), "the load did not answer after its server died"
        [loaded] = answer
        assert loaded.status_code == 200, loaded.text
        assert loaded.json()["runtime_state"] == "failed"
        assert "exited with code -9" in loaded.json()["last_error"]
        assert not alive(record["pid"]) and pidfiles(state) == []
        refused = http.post("/v1/responses", json={"model": "m", "input": "x"})
        assert (refused.status_code, refused.json()["error"]["code"]) == (409, "model_failed")
        assert configured(http) == before
    # the same definition, now ready at once, loads in a fresh service over the same state folder
    models["m"]["vllm_serve_env"].pop("FAKE_READY_AFTER")
    restarted = live_service(models, env={"LLMPOOL_STATE_DIR": str(state)})
    with restarted.client() as http:
        assert http.post("/v1/admin/models/m/load").json()["runtime_state"] == "loaded"
    assert service.stop() == 0 and restarted.stop() == 0
