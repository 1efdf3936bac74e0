"""The managed backends through a real ``manage.py serve``, against the fake servers."""
from __future__ import annotations

import os
import signal
import subprocess

import httpx
import pytest

from runtime.backends import BACKENDS
from runtime.backends.sglang_serve.spec import sglang_serve_command
from runtime.backends.trtllm_serve.spec import trtllm_serve_command
from runtime.backends.vllm_serve.spec import vllm_serve_command
from tests.conftest import free_port
from tests.managed.helpers import (
    TARGET,
    alive,
    output_text,
    pidfiles,
    records,
    sse_events,
    wait_until,
)
from tests.spec_examples import SGLANG_BODY, TRTLLM_BODY, VLLM_BODY

BINARIES = {"vllm_serve": "vllm", "sglang_serve": "sglang", "trtllm_serve": "trtllm-serve"}


def fake_model(backend: str, fake_bin, folder, **env) -> dict:
    return {
        "backend": backend,
        f"{backend}_model": TARGET,
        f"{backend}_binary": str(fake_bin / BINARIES[backend]),
        f"{backend}_env": {"FAKE_RECORD": str(folder / f"{backend}.jsonl"), **env},
        f"{backend}_startup_timeout_seconds": 30.0,
    }


def entry(http: httpx.Client, name: str) -> dict:
    return next(model for model in http.get("/v1/admin/models").json()["models"] if model["name"] == name)


def respond(http: httpx.Client, model: str, prompt, **fields) -> httpx.Response:
    return http.post("/v1/responses", json={"model": model, "input": prompt, **fields})


def expected_command(backend: str, definition: dict, body: dict, argv: list[str], yaml_path: str | None) -> list[str]:
    spec = BACKENDS[backend]
    model = spec.definition_model.model_validate(definition)
    config = spec.effective_config(model, spec.validate_overrides(model, body))
    port = int(argv[argv.index("--port") + 1])
    if backend == "vllm_serve":
        return vllm_serve_command(config, "127.0.0.1", port, "")
    if backend == "sglang_serve":
        return sglang_serve_command(config, "127.0.0.1", port, "")
    return trtllm_serve_command(config, "127.0.0.1", port, "", yaml_path)


@pytest.fixture
def service_env(tmp_path) -> dict:
    return {"LLMPOOL_STATE_DIR": str(tmp_path / "state")}


def test_each_backend_loads_its_example_body_answers_and_unloads(live_service, fake_bin, tmp_path, service_env):
    bodies = {"vllm_serve": VLLM_BODY, "sglang_serve": SGLANG_BODY, "trtllm_serve": TRTLLM_BODY}
    models = {backend: fake_model(backend, fake_bin, tmp_path) for backend in bodies}
    service = live_service(models, env=service_env)
    state = tmp_path / "state"
    with service.client() as http:
        for backend, body in bodies.items():
            loaded = http.post(f"/v1/admin/models/{backend}/load", json=body).json()
            assert (loaded["runtime_state"], loaded["last_error"]) == ("loaded", None)
            assert loaded["load_override"] == body
            [start] = records(tmp_path / f"{backend}.jsonl")
            yaml_path = start["argv"][start["argv"].index("--config") + 1] if backend == "trtllm_serve" else None
            assert [models[backend][f"{backend}_binary"], *start["argv"]] == expected_command(
                backend, models[backend], body, start["argv"], yaml_path
            )

            answer = respond(http, backend, "hello pool")
            assert answer.status_code == 200, answer.text
            assert output_text(answer.json()) == "echo: hello pool"
            assert answer.json()["usage"]["output_tokens"] == 3
            streamed = {"model": backend, "input": "a b c", "stream": True}
            with http.stream("POST", "/v1/responses", json=streamed) as stream:
                events = sse_events(stream)
            deltas = [event["delta"] for event in events if event["type"] == "response.output_text.delta"]
            assert "".join(deltas) == "echo: a b c" and events[-1]["type"] == "response.completed"

        schema = {"format": {"type": "json_schema", "name": "echo", "schema": {"type": "object"}, "strict": True}}
        structured = respond(http, "vllm_serve", "json please", text=schema)
        assert output_text(structured.json()) == '{"echo": "json please"}'
        refused = respond(http, "sglang_serve", "json please", text=schema)
        assert (refused.status_code, refused.json()["error"]["code"]) == (400, "response_format_unsupported")

        leaders = [record["pid"] for record in pidfiles(state)]
        assert len(leaders) == 3
        for backend in bodies:
            assert http.post(f"/v1/admin/models/{backend}/unload").json()["runtime_state"] == "unloaded"
        assert not any(alive(pid) for pid in leaders)
        assert pidfiles(state) == [] and list((state / "tmp").iterdir()) == []
    assert service.stop() == 0


def test_a_server_crash_fails_the_model_and_a_new_load_recovers(live_service, fake_bin, tmp_path, service_env):
    service = live_service({"m": fake_model("sglang_serve", fake_bin, tmp_path)}, env=service_env)
    with service.client() as http:
        assert http.post("/v1/admin/models/m/load", json={"target_inflight": 2}).json()["runtime_state"] == "loaded"
        [record] = pidfiles(tmp_path / "state")
        os.kill(record["pid"], signal.SIGKILL)
        failed = wait_until(lambda: (e := entry(http, "m"))["runtime_state"] == "failed" and e, 5, message="failed")
        assert failed["last_error"].startswith(
            "sglang serve for model m, replica 1 exited with code -9 (SIGKILL) while loaded"
        )
        assert "INFO listening on 127.0.0.1" in failed["last_error"]
        refused = respond(http, "m", "still there?")
        assert (refused.status_code, refused.json()["error"]["code"]) == (409, "model_failed")
        assert http.post("/v1/admin/models/m/load").json()["runtime_state"] == "loaded"
        assert output_text(respond(http, "m", "back again").json()) == "echo: back again"
    assert service.stop() == 0


def test_kill_9_of_the_runtime_leaves_no_server_behind(live_service, fake_bin, tmp_path, service_env):
    models = {backend: fake_model(backend, fake_bin, tmp_path) for backend in BINARIES}
    service = live_service(models, env=service_env)
    with service.client() as http:
        for backend in models:
            assert http.post(f"/v1/admin/models/{backend}/load").json()["runtime_state"] == "loaded"
    leaders = [record["pid"] for record in pidfiles(tmp_path / "state")]
    assert len(leaders) == 3
    service.process.kill()
    service.process.wait()
    wait_until(lambda: not any(alive(pid) for pid in leaders), 5, message="no survivor within 5 s")


def test_a_restarted_runtime_sweeps_what_the_crashed_one_left(live_service, fake_bin, tmp_path, service_env):
    model = fake_model("vllm_serve", fake_bin, tmp_path, FAKE_CHILD="1")
    crashed = live_service({"m": model}, env=service_env)
    with crashed.client() as http:
        assert http.post("/v1/admin/models/m/load").json()["runtime_state"] == "loaded"
    [start] = records(tmp_path / "vllm_serve.jsonl")
    crashed.process.kill()
    crashed.process.wait()
    wait_until(lambda: not alive(start["pid"]), 5, message="the leader died with its runtime")
    assert alive(start["child_pid"])  # a worker outlives its leader: only the sweep can find it
    restarted = live_service({"m": {**model, "enabled": True}}, env=service_env)
    with restarted.client() as http:
        wait_until(lambda: entry(http, "m")["runtime_state"] == "loaded", 30, message="loaded at start-up")
    assert not alive(start["child_pid"])
    new_server = records(tmp_path / "vllm_serve.jsonl")[1]["pid"]
    assert [record["pid"] for record in pidfiles(tmp_path / "state")] == [new_server]
    assert restarted.stop() == 0


# ---- openai_remote against a real OpenAI-compatible process ----------------------------------


@pytest.fixture
def remote_server(fake_bin):
    """A fake vllm serve process that requires the API key ``k-1``: base URL of its API."""
    port = free_port()
    argv = [str(fake_bin / "vllm"), "serve", "remote-model", "--host", "127.0.0.1", "--port", str(port),
            "--api-key", "k-1"]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: _healthy(base), 10, message="remote up")
    yield base + "/v1"
    process.terminate()
    process.wait(timeout=10)


def _healthy(base: str) -> bool:
    try:
        return httpx.get(base + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_openai_remote_forwards_to_the_remote_and_maps_its_errors(live_service, remote_server, service_env):
    remote = {"backend": "openai_remote", "remote_base_url": remote_server, "remote_model": "remote-model"}
    models = {
        "remote": {**remote, "remote_api_key_env": "REMOTE_KEY"},
        "no-key": {**remote, "remote_api_key_env": "UNSET_REMOTE_KEY"},
        "wrong-key": {**remote, "remote_api_key": "nope"},
        "upload": {**remote, "remote_api_key": "k-1", "remote_file_mode": "upload"},
        "inline": {**remote, "remote_api_key": "k-1", "remote_file_mode": "inline"},
        "down": {**remote, "remote_base_url": f"http://127.0.0.1:{free_port()}/v1"},
    }
    service = live_service(models, service={"allow_remote_execution": True}, env={**service_env, "REMOTE_KEY": "k-1"})
    with service.client() as http:
        for name in models:
            http.post(f"/v1/admin/models/{name}/load")
        assert entry(http, "no-key")["last_error"].endswith(
            "the environment variable UNSET_REMOTE_KEY (remote_api_key_env) is not set"
        )
        assert output_text(respond(http, "remote", "over there").json()) == "echo: over there"
        with http.stream("POST", "/v1/responses", json={"model": "remote", "input": "x y", "stream": True}) as stream:
            deltas = [e["delta"] for e in sse_events(stream) if e["type"] == "response.output_text.delta"]
        assert "".join(deltas) == "echo: x y"

        def error_of(model: str, text: str) -> tuple[int, str, str]:
            answer = respond(http, model, text)
            return answer.status_code, answer.json()["error"]["code"], answer.json()["error"]["message"]

        status, code, message = error_of("remote", "__error_400__")
        assert (status, code) == (400, "invalid_request") and "answered 400: bad request for the fake" in message
        assert error_of("remote", "__context__")[:2] == (400, "context_length_exceeded")
        status, code, message = error_of("remote", "__error_500__")
        assert (status, code) == (502, "upstream_error") and "answered 500: the fake broke" in message
        status, code, message = error_of("wrong-key", "hi")
        assert (status, code) == (502, "upstream_error") and "answered 401: invalid API key" in message
        assert error_of("down", "hi")[:2] == (502, "upstream_error")

        data = "data:text/plain;base64,aGVsbG8gZmlsZQ=="  # "hello file"
        file_input = [{"role": "user", "content": [
            {"type": "input_text", "text": "read"},
            {"type": "input_file", "filename": "note.txt", "file_data": data},
        ]}]
        assert output_text(respond(http, "upload", file_input).json()) == "echo: read [file-1 10 bytes]"
        assert httpx.get(remote_server + "/files", headers={"Authorization": "Bearer k-1"}).json()["data"] == []
        assert output_text(respond(http, "inline", file_input).json()) == "echo: read [inline note.txt]"
        refused = respond(http, "remote", file_input)
        assert (refused.status_code, refused.json()["error"]["code"]) == (400, "file_input_unsupported")
    assert service.stop() == 0
