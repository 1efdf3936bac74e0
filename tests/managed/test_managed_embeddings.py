"""POST /v1/embeddings to managed servers and openai_remote through a real ``manage.py serve``:
the fake vllm (started with --runner pooling) and a fake remote answer the forwarded request
(model renamed to the upstream's, floats asked for, dimensions passed on), its errors map as a
generation's do; and llama-server for real, started with --embeddings on SmolLM2."""
from __future__ import annotations

import base64
import json
import os
import subprocess

import httpx
import numpy
import openai
import pytest

from tests.conftest import free_port
from tests.managed.helpers import TARGET, pidfiles, records, vllm_model, wait_until


@pytest.fixture
def service_env(tmp_path) -> dict:
    return {"LLMPOOL_STATE_DIR": str(tmp_path / "state")}


def logged(folder) -> list[dict]:
    path = folder / "requests.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def error_of(answer: httpx.Response) -> tuple[int, str, str | None]:
    return answer.status_code, answer.json()["error"]["code"], answer.json()["error"]["param"]


def test_vllm_serve_forwards_embeddings_to_its_pooling_runner(live_service, fake_bin, tmp_path, service_env):
    models = {"embed": vllm_model(fake_bin, tmp_path, embeddings=True), "chat": vllm_model(fake_bin, tmp_path)}
    service = live_service(models, env=service_env)
    with service.client() as http, openai.OpenAI(base_url=service.url + "/v1", api_key="x", max_retries=0) as client:
        assert http.post("/v1/admin/models/embed/load").json()["runtime_state"] == "loaded"
        [start] = records(tmp_path / "vllm.jsonl")
        assert start["argv"][-2:] == ["--runner", "pooling"]

        answer = client.embeddings.create(model="embed", input=["one", "two words"])  # base64 to the client
        assert [item.embedding for item in answer.data] == [[3.0, 0.0, 0.5, 0.5], [9.0, 1.0, 0.5, 0.5]]
        assert (answer.usage.prompt_tokens, answer.model) == (3, "embed")
        assert logged(tmp_path)[-1] == {"model": TARGET, "input": ["one", "two words"], "encoding_format": "float"}

        sized = client.embeddings.create(model="embed", input=[[7, 8]], dimensions=6, encoding_format="float")
        assert sized.data[0].embedding == [3.0, 0.0, 0.5, 0.5, 0.5, 0.5]
        assert logged(tmp_path)[-1] == {"model": TARGET, "input": [[7, 8]], "encoding_format": "float", "dimensions": 6}

        refused = http.post("/v1/embeddings", json={"model": "embed", "input": ["ok", "__error_400__"]})
        assert error_of(refused) == (400, "invalid_request", "input")
        assert "answered 400: input refused" in refused.json()["error"]["message"]
        # A pooling runner serves embeddings only: its chat refusal comes back as the request's 400.
        chat = http.post("/v1/chat/completions", json={"model": "embed", "messages": [{"role": "user", "content": "x"}]})
        assert chat.status_code == 400
        assert http.post("/v1/embeddings", json={"model": "chat", "input": "x"}).json()["error"]["code"] == (
            "embeddings_unsupported"
        )
        assert http.post("/v1/admin/models/embed/unload").json()["runtime_state"] == "unloaded"
    assert service.stop() == 0


@pytest.fixture
def pooling_remote(fake_bin, tmp_path):
    """A fake vllm serve with --runner pooling that requires the key ``k-1``: its API's base URL."""
    port = free_port()
    argv = [str(fake_bin / "vllm"), "serve", "remote-model", "--host", "127.0.0.1", "--port", str(port),
            "--api-key", "k-1", "--runner", "pooling"]
    env = {**os.environ, "FAKE_REQUEST_LOG": str(tmp_path / "requests.jsonl")}
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _healthy(base), 10, message="remote up")
        yield base + "/v1"
    finally:
        process.terminate()
        process.wait(timeout=10)


def _healthy(base: str) -> bool:
    try:
        return httpx.get(base + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_openai_remote_forwards_embeddings(live_service, pooling_remote, tmp_path, service_env):
    remote = {"backend": "openai_remote", "remote_base_url": pooling_remote, "remote_model": "remote-model",
              "remote_api_key": "k-1", "embeddings": True}
    models = {
        "remote": remote,
        "wrong-key": {**remote, "remote_api_key": "nope"},
        "down": {**remote, "remote_base_url": f"http://127.0.0.1:{free_port()}/v1"},
    }
    service = live_service(models, service={"allow_remote_execution": True}, env=service_env)
    with service.client() as http:
        for name in models:
            assert http.post(f"/v1/admin/models/{name}/load").json()["runtime_state"] == "loaded"
        answer = http.post("/v1/embeddings", json={"model": "remote", "input": "abc", "encoding_format": "base64",
                                                   "dimensions": 3})
        assert answer.status_code == 200, answer.text
        vector = numpy.frombuffer(base64.b64decode(answer.json()["data"][0]["embedding"]), "<f4").tolist()
        assert vector == [3.0, 0.0, 0.5]
        assert logged(tmp_path)[-1] == {"model": "remote-model", "input": ["abc"], "encoding_format": "float",
                                        "dimensions": 3}
        wrong = http.post("/v1/embeddings", json={"model": "wrong-key", "input": "abc"})
        assert error_of(wrong)[:2] == (502, "upstream_error") and "answered 401" in wrong.json()["error"]["message"]
        assert error_of(http.post("/v1/embeddings", json={"model": "down", "input": "abc"}))[:2] == (
            502, "upstream_error"
        )
    assert service.stop() == 0


def test_openai_remote_needs_remote_execution_allowed(live_service, pooling_remote, service_env):
    remote = {"backend": "openai_remote", "remote_base_url": pooling_remote, "remote_model": "remote-model",
              "embeddings": True}
    service = live_service({"remote": remote}, env=service_env)
    with service.client() as http:
        http.post("/v1/admin/models/remote/load")
        answer = http.post("/v1/embeddings", json={"model": "remote", "input": "abc"})
        assert error_of(answer) == (403, "remote_execution_disallowed", None)
    assert service.stop() == 0


def test_llama_server_with_embeddings_on_smollm2(live_service, llama_server_binary, smollm2_gguf, tmp_path, service_env):
    """llama-server for real: started with --embeddings --pooling mean (SmolLM2 declares no pooling);
    its vectors are unit length, 576 values, the same for the same input; it still chats."""
    model = {
        "backend": "llama_server", "model_path": smollm2_gguf, "llama_server_binary": llama_server_binary,
        "llama_server_n_ctx": 1024, "llama_server_startup_timeout_seconds": 60.0, "embeddings": True,
    }
    service = live_service({"smol": model}, env=service_env)
    with service.client(timeout=120) as http, openai.OpenAI(
        base_url=service.url + "/v1", api_key="x", max_retries=0, timeout=120
    ) as client:
        assert http.post("/v1/admin/models/smol/load").json()["runtime_state"] == "loaded"
        [record] = pidfiles(tmp_path / "state")
        assert record["argv"][-3:] == ["--embeddings", "--pooling", "mean"]
        texts = ["The cat sat on the mat.", "Quantum chromodynamics.", "The cat sat on the mat."]
        answer = client.embeddings.create(model="smol", input=texts)
        found = numpy.array([item.embedding for item in answer.data])
        assert found.shape == (3, 576)
        assert numpy.allclose(numpy.linalg.norm(found, axis=1), 1.0, atol=1e-5)
        assert numpy.allclose(found[0], found[2], atol=1e-6) and not numpy.allclose(found[0], found[1], atol=1e-3)
        assert answer.usage.prompt_tokens > 5
        chat = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        assert chat.choices[0].message.content
        assert http.post("/v1/admin/models/smol/unload").json()["runtime_state"] == "unloaded"
    assert service.stop() == 0
