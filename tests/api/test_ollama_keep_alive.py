"""Ollama's keep_alive where the operator lets clients say it (service.ollama_keep_alive): the
model's TTL from that request until it unloads.  Off (the default), tests/api/test_ollama_api.py
shows it ignored."""
from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from tests.conftest import service_with_loaded_models

MODELS = {
    "brief": {"backend": "stub", "stub_reply": "bye"},
    "kept": {"backend": "stub", "stub_reply": "still here", "ttl_seconds": 1, "load_on_request": True},
    "timed": {"backend": "stub", "stub_reply": "later"},
}


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    with service_with_loaded_models(tmp_path_factory.mktemp("keep"), MODELS, unloaded=(),
                                    service={"ollama_keep_alive": True}) as live:
        yield live


@pytest.fixture
def http(service):
    with service.client(timeout=30) as client:
        yield client


def running(http) -> dict[str, dict]:
    return {model["name"]: model for model in http.get("/api/ps").json()["models"]}


def generate(http, model: str, keep_alive) -> None:
    answer = http.post("/api/generate", json={"model": model, "prompt": "hi", "stream": False,
                                              "keep_alive": keep_alive})
    assert answer.status_code == 200, answer.text


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_keep_alive_zero_unloads_the_model_once_it_is_idle(http):
    generate(http, "brief", 0)
    assert wait_for(lambda: "brief" not in running(http), 10)
    models = {entry["name"]: entry for entry in http.get("/v1/admin/models").json()["models"]}
    assert models["brief"]["runtime_state"] == "unloaded"


def test_a_duration_is_the_ttl_from_that_request_on(http):
    generate(http, "timed", "10m")
    expires = datetime.fromisoformat(running(http)["timed"]["expires_at"].replace("Z", "+00:00"))
    left = (expires - datetime.now(timezone.utc)).total_seconds()
    assert 590 < left <= 600


def test_a_negative_keep_alive_keeps_a_model_its_definition_would_unload(http):
    generate(http, "kept", -1)
    time.sleep(2.5)  # past the definition's ttl_seconds of 1
    assert "kept" in running(http)
    assert running(http)["kept"]["expires_at"].startswith("9999")


def test_a_keep_alive_that_is_no_duration_is_refused_naming_it(http):
    answer = http.post("/api/generate", json={"model": "timed", "prompt": "hi", "keep_alive": "soon"})
    assert answer.status_code == 400
    assert "keep_alive" in answer.json()["error"]
