"""llama_server for real: the cached llama-server build serving SmolLM2 through ``manage.py serve``."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port
from tests.managed.helpers import alive, output_text, pidfiles, sse_events, wait_until

SHORT = {"max_output_tokens": 8, "temperature": 0.0}


@pytest.fixture
def llama_model(llama_server_binary, smollm2_gguf) -> dict:
    return {
        "backend": "llama_server",
        "model_path": smollm2_gguf,
        "llama_server_binary": llama_server_binary,
        "llama_server_n_ctx": 1024,
        "llama_server_startup_timeout_seconds": 60.0,
    }


@pytest.fixture
def service_env(tmp_path) -> dict:
    return {"LLMPOOL_STATE_DIR": str(tmp_path / "state")}


def entry(http: httpx.Client, name: str) -> dict:
    return next(model for model in http.get("/v1/admin/models").json()["models"] if model["name"] == name)


def respond(http: httpx.Client, model: str, prompt: str, **fields) -> httpx.Response:
    return http.post("/v1/responses", json={"model": model, "input": prompt, **SHORT, **fields})


def server_url(record: dict) -> str:
    argv = record["argv"]
    return f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"


def test_load_with_overrides_serves_concurrent_and_streamed_requests_then_unloads(
    live_service, llama_model, tmp_path, service_env
):
    service = live_service({"smol": llama_model}, env=service_env)
    with service.client(timeout=120) as http:
        loaded = http.post("/v1/admin/models/smol/load", json={"target_inflight": 2, "llama_server_n_ctx": 2048}).json()
        assert (loaded["runtime_state"], loaded["last_error"]) == ("loaded", None)
        assert loaded["effective_target_inflight"] == 2
        [record] = pidfiles(tmp_path / "state")
        argv = record["argv"]
        assert argv[argv.index("--parallel") + 1] == "2" and argv[argv.index("-c") + 1] == "2048"
        props = httpx.get(server_url(record) + "/props", timeout=10).json()
        assert props["total_slots"] == 2  # the override really reached llama-server

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda i: respond(http, "smol", f"Count to {i}."), range(4)))
        for answer in answers:
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert output_text(body) and 0 < body["usage"]["output_tokens"] <= 8 and body["usage"]["input_tokens"] > 0

        stream_body = {"model": "smol", "input": "Say hello.", "stream": True, **SHORT}
        with http.stream("POST", "/v1/responses", json=stream_body) as stream:
            events = sse_events(stream)
        deltas = [event["delta"] for event in events if event["type"] == "response.output_text.delta"]
        final = events[-1]["response"]
        assert len(deltas) >= 2 and "".join(deltas) == output_text(final)
        assert final["status"] in ("completed", "incomplete")

        # Typed requests (Ollama's, Anthropic's) on the forwarded server: top_k 1 reaches llama-server
        # (a hot draw is then the greedy answer, whatever the seed), and Claude Code's max_tokens
        # 32000 is no refusal.
        def ollama_text(**options) -> str:
            body = {"model": "smol", "stream": False, "messages": [{"role": "user", "content": "Write a poem."}],
                    "options": {"num_predict": 8, **options}}
            return http.post("/api/chat", json=body).json()["message"]["content"]

        greedy = ollama_text(temperature=0.0)
        assert {ollama_text(temperature=2.0, seed=seed) for seed in (1, 2)} - {greedy}
        assert {ollama_text(temperature=2.0, seed=seed, top_k=1) for seed in (1, 2)} == {greedy}
        unbounded = http.post("/v1/messages", json={"model": "smol", "max_tokens": 32000, "temperature": 0.0,
                                                    "messages": [{"role": "user", "content": "Say hello."}]})
        assert unbounded.status_code == 200 and unbounded.json()["content"][0]["text"], unbounded.text

        assert http.post("/v1/admin/models/smol/unload").json()["runtime_state"] == "unloaded"
        assert not alive(record["pid"]) and pidfiles(tmp_path / "state") == []
    assert service.stop() == 0


def test_a_client_leaving_a_non_streamed_request_stops_llama_servers_generation(
    live_service, llama_model, tmp_path, service_env
):
    # llama-server notices a closed connection only while it streams: the engine streams every
    # upstream call that may run past llama_server_unstreamed_max_tokens (16), so a non-streamed
    # request whose client left stops there as well, at once, instead of holding the server's slot
    # until its 2,000 tokens are written.
    service = live_service({"smol": {**llama_model, "llama_server_n_ctx": 4096}}, env=service_env)
    with service.client(timeout=120) as http:
        assert http.post("/v1/admin/models/smol/load", json={}).json()["runtime_state"] == "loaded"
        slots_url = server_url(pidfiles(tmp_path / "state")[0]) + "/slots"

        def busy() -> bool:
            return any(slot["is_processing"] for slot in httpx.get(slots_url, timeout=10).json())

        long_request = {"model": "smol", "input": "Write a long story about a dragon who learns to bake bread.",
                        "max_output_tokens": 2000, "temperature": 0.0}
        with ThreadPoolExecutor(1) as pool, service.client(timeout=httpx.Timeout(120, read=2.0)) as leaving:
            # The client gives up after 2 s and closes its connection; the server is generating by then.
            leaving_request = pool.submit(leaving.post, "/v1/responses", json=long_request)
            wait_until(busy, timeout=2, message="llama-server generating")
            with pytest.raises(httpx.ReadTimeout):
                leaving_request.result()
        wait_until(lambda: not busy(), timeout=5, message="llama-server's slot freed after the client left")
        answer = respond(http, "smol", "Say yes.")
        assert answer.status_code == 200 and output_text(answer.json())
    assert service.stop() == 0


def test_crash_fails_with_the_log_tail_and_kill_9_of_the_runtime_leaves_no_survivor(
    live_service, llama_model, tmp_path, service_env
):
    service = live_service({"smol": llama_model, "twin": llama_model}, env=service_env)
    state = tmp_path / "state"
    with service.client(timeout=120) as http:
        assert http.post("/v1/admin/models/smol/load").json()["runtime_state"] == "loaded"
        [record] = pidfiles(state)
        os.kill(record["pid"], signal.SIGKILL)
        wait_until(lambda: entry(http, "smol")["runtime_state"] == "failed", 5, message="failed")
        last_error = entry(http, "smol")["last_error"]
        assert last_error.startswith(
            "llama-server for model smol, replica 1 exited with code -9 (SIGKILL) while loaded"
        )
        assert "last output:" in last_error and "llama_server: listening on http://127.0.0.1:" in last_error
        log = state / "logs" / "smol.r0.log"
        assert "llama_server: model loaded" in log.read_text()

        assert http.post("/v1/admin/models/smol/load").json()["runtime_state"] == "loaded"
        assert http.post("/v1/admin/models/twin/load", json={"target_inflight": 2}).json()["runtime_state"] == "loaded"
        assert respond(http, "twin", "Hi.").status_code == 200
    leaders = [entry["pid"] for entry in pidfiles(state)]
    assert len(leaders) == 2 and all(alive(pid) for pid in leaders)
    service.process.kill()
    service.process.wait()
    began = time.monotonic()
    wait_until(lambda: not any(alive(pid) for pid in leaders), 5, message="no llama-server survives within 5 s")
    assert time.monotonic() - began < 5


def test_the_start_up_sweep_kills_a_server_a_crashed_runtime_left(live_service, llama_model, tmp_path, service_env):
    """A llama-server whose owner died without taking it along (no death signal) is found by its pidfile."""
    state = tmp_path / "state"
    (state / "managed").mkdir(parents=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = subprocess.Popen(
        [llama_model["llama_server_binary"], "--model", llama_model["model_path"], "--port", str(free_port())],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    start_time = Path(f"/proc/{orphan.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    (state / "managed" / f"{orphan.pid}.json").write_text(json.dumps({
        "pid": orphan.pid, "pgid": orphan.pid, "start_time": start_time,
        "owner_pid": gone.pid, "owner_start_time": "1", "label": "llama-server for model smol, replica 1",
        "argv": orphan.args,
    }))
    try:
        service = live_service({"smol": {**llama_model, "enabled": True}}, env=service_env)
        with service.client(timeout=60) as http:
            wait_until(lambda: entry(http, "smol")["runtime_state"] == "loaded", 60, message="loaded at start-up")
        assert orphan.wait(timeout=5) == -signal.SIGKILL
        assert [record["pid"] for record in pidfiles(state)] != [orphan.pid] and len(pidfiles(state)) == 1
        assert service.stop() == 0
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()


def test_openai_remote_against_llama_server(live_service, llama_model, tmp_path, service_env):
    service = live_service({"smol": llama_model}, service={"allow_remote_execution": True}, env=service_env)
    with service.client(timeout=120) as http:
        assert http.post("/v1/admin/models/smol/load").json()["runtime_state"] == "loaded"
        [record] = pidfiles(tmp_path / "state")
        remote = {
            "backend": "openai_remote", "remote_base_url": server_url(record) + "/v1", "remote_model": "smol",
        }
        settings = json.loads(service.settings_path.read_text())
        settings["models"]["remote"] = remote
        service.settings_path.write_text(json.dumps(settings))
        assert http.post("/v1/admin/settings/reload").json()["added_models"] == ["remote"]
        assert http.post("/v1/admin/models/remote/load").json()["runtime_state"] == "loaded"
        direct = respond(http, "smol", "Name a color.").json()
        forwarded = respond(http, "remote", "Name a color.").json()
        assert output_text(forwarded) == output_text(direct)  # greedy: the same server, the same answer
        # The same prompt again: llama-server reuses it from its slot, and says so through both.
        cached = forwarded["usage"].pop("input_tokens_details")["cached_tokens"]
        assert cached >= direct["usage"]["input_tokens"] - 2 and direct["usage"]["input_tokens_details"]["cached_tokens"] == 0
        direct["usage"].pop("input_tokens_details")
        assert forwarded["usage"] == direct["usage"]
    assert service.stop() == 0


@pytest.mark.skipif(
    os.environ.get("LLMPOOL_LLAMA_NATIVE") == "1" or bool(os.environ.get("LLMPOOL_LLAMA_CMAKE_ARGS")),
    reason="an operator's own llama.cpp build flags are in force",
)
def test_the_cached_llama_server_is_the_portable_build(llama_server_binary, smollm2_gguf):
    """Its system_info line (printed at log verbosity 4) shows AVX2 and no AMX, as llama-cpp-python's."""
    command = [llama_server_binary, "-m", smollm2_gguf, "--port", str(free_port()), "-t", "1", "-lv", "4"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = threading.Timer(60, server.kill)  # the output ends by then, whatever it printed
    deadline.start()
    try:
        line = next((line for line in server.stdout if "system_info" in line), "")
    finally:
        deadline.cancel()
        server.kill()
        server.wait(10)
    assert "AVX2 = 1" in line, line
    assert "AMX" not in line and "AVX512" not in line, line
