"""Pass-through against the fake vLLM, SGLang and TensorRT-LLM servers and openai_remote: the
client's own chat completions body reaches the upstream as it is (model renamed, usage asked
for on a stream), and the upstream's answer and chunks come back as it wrote them, every chunk
validated strictly against the openai package's own types."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from models_app.api.chat.protocol import parse_chat_body
from runtime.inference.admission import estimate_prompt_tokens
from runtime.errors import ContextLengthExceeded, InvalidRequest, RequestTimeout
from runtime.inputs.request import GenerationRequest
from tests.conftest import free_port
from tests.managed.helpers import TARGET, eventually, requests_logged, wait_until

BINARIES = {"vllm_serve": "vllm", "sglang_serve": "sglang", "trtllm_serve": "trtllm-serve"}
# Fields the typed path refuses (or does not know) and that an upstream judges for itself.
EXTRAS = {
    "logprobs": True, "top_logprobs": 2, "n": 2, "seed": 7, "presence_penalty": 0.5, "logit_bias": {"42": -1.0},
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}],
    "tool_choice": "auto", "grammar": 'root ::= "yes"', "top_k": 5, "user": "alice", "max_tokens": 16,
}
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]


def managed(backend: str, fake_bin, folder, **fields) -> dict:
    return {
        "backend": backend,
        f"{backend}_model": TARGET,
        f"{backend}_binary": str(fake_bin / BINARIES[backend]),
        f"{backend}_env": {"FAKE_REQUEST_LOG": str(folder / f"{backend}.requests.jsonl"), **fields.pop("env", {})},
        f"{backend}_startup_timeout_seconds": 30.0,
        **fields,
    }


@pytest.fixture
def remote(fake_bin, tmp_path):
    """Factory: ``remote(**env)`` starts a fake vllm serve process that needs the API key ``k-1``
    and answers its base URL (``.../v1``) and its request log."""
    started: list[subprocess.Popen] = []

    def start_remote(**env) -> tuple[str, object]:
        port = free_port()
        log = tmp_path / "remote.requests.jsonl"
        argv = [str(fake_bin / "vllm"), "serve", "remote-model", "--host", "127.0.0.1", "--port", str(port),
                "--api-key", "k-1"]
        started.append(subprocess.Popen(argv, env={**os.environ, "FAKE_REQUEST_LOG": str(log), **env},
                                        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _healthy(base), 10, message="remote up")
        return base + "/v1", log

    yield start_remote
    for process in started:
        process.terminate()
        process.wait(timeout=10)


def _healthy(base: str) -> bool:
    try:
        return httpx.get(base + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def start(live_service, fake_bin, tmp_path, remote, mode=None, env=None, **fields):
    """A service with one model per fake backend plus one on a ``remote`` (the fakes get ``env``),
    all loaded: the service, and the request log and served name of each model."""
    models = {backend: managed(backend, fake_bin, tmp_path, env=dict(env or {}), **fields) for backend in BINARIES}
    base_url, remote_log = remote(**(env or {}))
    models["remote"] = {"backend": "openai_remote", "remote_base_url": base_url, "remote_model": "remote-model",
                        "remote_api_key": "k-1", **fields}
    upstreams = {backend: (tmp_path / f"{backend}.requests.jsonl", TARGET) for backend in BINARIES}
    upstreams["remote"] = (remote_log, "remote-model")
    kwargs = {"mode": mode} if mode else {}
    service = live_service(models, service={"allow_remote_execution": True},
                           env={"LLMPOOL_STATE_DIR": str(tmp_path / "state")}, **kwargs)
    with service.client() as http:
        for name in models:
            loaded = http.post(f"/v1/admin/models/{name}/load").json()
            assert (loaded["runtime_state"], loaded["last_error"]) == ("loaded", None)
    return service, upstreams


def stream_lines(http: httpx.Client, body: dict) -> list[str]:
    with http.stream("POST", "/v1/chat/completions", json=body) as answer:
        assert answer.status_code == 200, answer.read()
        assert answer.headers["content-type"] == "text/event-stream"
        return [line for line in answer.iter_lines() if line]


def strict_chunks(lines: list[str]) -> list[ChatCompletionChunk]:
    """Every line a ``data:`` event, the last one ``[DONE]``, the others strict chat.completion.chunks."""
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    return [ChatCompletionChunk.model_validate(json.loads(line[6:]), strict=True) for line in lines[:-1]]


@pytest.mark.parametrize("mode", ["embedded", "split"])
def test_every_upstream_gets_the_clients_body_and_answers_as_it_wrote(live_service, fake_bin, tmp_path, remote, mode):
    service, upstreams = start(live_service, fake_bin, tmp_path, remote, mode)
    with service.client() as http, openai.OpenAI(base_url=service.url + "/v1", api_key="x", max_retries=0) as client:
        for name, (log, served) in upstreams.items():
            body = {"model": name, "messages": MESSAGES, **EXTRAS}
            answer = http.post("/v1/chat/completions", json=body)
            assert answer.status_code == 200, answer.text
            assert requests_logged(log)[-1] == {**body, "model": served}  # exactly the client's, renamed
            completion = ChatCompletion.model_validate(answer.json(), strict=True)
            assert (completion.id, completion.model) == ("chatcmpl-fake", name)  # the upstream's own answer
            assert completion.choices[0].message.content == "echo: hi there"
            assert completion.usage.total_tokens == 4 + 3  # the fake counts words

            # Streamed: usage asked of the upstream, left out again for a client that did not ask.
            lines = stream_lines(http, {**body, "stream": True})
            assert requests_logged(log)[-1] == {**body, "model": served, "stream": True,
                                                "stream_options": {"include_usage": True}}
            chunks = strict_chunks(lines)
            assert all((chunk.id, chunk.model) == ("chatcmpl-fake", name) for chunk in chunks)
            assert all("usage" not in json.loads(line[6:]) for line in lines[:-1])
            assert "".join(c.choices[0].delta.content or "" for c in chunks) == "echo: hi there"
            assert chunks[-1].choices[0].finish_reason == "stop"

            # The official client, asking for the usage chunk itself.
            stream = client.chat.completions.create(
                model=name, messages=MESSAGES, stream=True, stream_options={"include_usage": True},
                logprobs=True, top_logprobs=1, extra_body={"grammar": "root ::= [a-z]+"},
            )
            received = list(stream)
            assert requests_logged(log)[-1]["grammar"] == "root ::= [a-z]+"
            assert received[-1].choices == [] and received[-1].usage.completion_tokens == 3
            assert {chunk.model for chunk in received} == {name}
    assert service.stop() == 0


def test_upstream_refusals_are_our_400_and_the_request_timeout_still_applies(
    live_service, fake_bin, tmp_path, remote
):
    service, upstreams = start(live_service, fake_bin, tmp_path, remote,
                               env={"FAKE_TOKEN_DELAY_MS": "150"}, request_timeout_seconds=1.0)
    with service.client() as http:
        unknown = http.post("/v1/chat/completions", json={"model": "nope", "messages": MESSAGES, "n_probs": 1})
        assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "unknown_model")
        for name in upstreams:
            for stream in (False, True):
                def ask(text: str, **fields) -> httpx.Response:
                    body = {"model": name, "messages": [{"role": "user", "content": text}], "stream": stream, **fields}
                    return http.post("/v1/chat/completions", json=body)

                # A forwarded stream opens once the upstream answered: its refusal keeps its status.
                refused = ask("__error_400__", n_probs=3)
                assert refused.status_code == 400, refused.text
                error = refused.json()["error"]
                assert error["code"] == "invalid_request" and error["message"].endswith("answered 400: bad request for the fake")
                assert ask("__context__").json()["error"]["code"] == "context_length_exceeded"
                broken = ask("__error_500__").json()["error"]
                assert broken["code"] == ("upstream_error" if name == "remote" else "backend_error")

            # 21 tokens at 150 ms each: past request_timeout_seconds=1.
            slow = {"model": name, "messages": [{"role": "user", "content": " ".join(["w"] * 20)}]}
            timed_out = http.post("/v1/chat/completions", json=slow)
            assert (timed_out.status_code, timed_out.json()["error"]["code"]) == (504, "request_timeout")
            lines = stream_lines(http, {**slow, "stream": True})
            assert json.loads(lines[-2][6:])["error"]["code"] == "request_timeout" and lines[-1] == "data: [DONE]"
            strict_chunks(lines[:-2] + lines[-1:])  # what came before the error is the upstream's
    assert service.stop() == 0


# ---- in the runtime: tokens, the stream's opening, cancellation -------------------------------


def request_for(model: str, request_id: str, **fields) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": "hi there"}], **fields}
    forwarded = parse_chat_body(body, None).forwarded
    forwarded.typed.request_id = request_id
    return forwarded.to_wire()


async def test_tokens_are_counted_from_the_upstreams_usage(runtime_service, fake_bin, tmp_path):
    service, _ = await runtime_service({"m": managed("vllm_serve", fake_bin, tmp_path)})
    await service.op_load({"name": "m", "body": {}}, None)
    scheduler = service.pool.controller("m").scheduler
    emitted: list[dict] = []

    async def emit(event: dict) -> None:
        emitted.append(event)

    result = await service.op_generate(request_for("m", "r1", user="alice", n=2), emit)
    assert emitted == []  # not streamed: the one answer is the result
    assert result["upstream"]["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    assert result["usage"] == {"input_tokens": 2, "output_tokens": 3}
    await eventually(lambda: scheduler.keys["alice"].counter == 5, message="the upstream's count charged")

    result = await service.op_generate(request_for("m", "r2", user="alice", stream=True), emit)
    # The stream opens with the upstream's first chunk; the usage-only chunk the client did not
    # ask for is left out, but its count is charged.
    assert [event["event"] for event in emitted] == ["admitted"] + ["upstream"] * 5  # role, 3 tokens, finish
    assert all("usage" not in event["chunk"] for event in emitted[1:])
    assert result["usage"] == {"input_tokens": 2, "output_tokens": 3} and "upstream" not in result
    await eventually(lambda: scheduler.keys["alice"].counter == 10, message="the stream's usage charged")

    emitted.clear()
    with pytest.raises(InvalidRequest, match="answered 400: bad request for the fake"):
        await service.op_generate(request_for("m", "r3", stream=True, messages=[
            {"role": "user", "content": "__error_400__"}]), emit)
    with pytest.raises(ContextLengthExceeded):
        await service.op_generate(request_for("m", "r4", messages=[{"role": "user", "content": "__context__"}]), emit)
    assert emitted == []  # refused before the stream opened


async def test_a_cancelled_stream_closes_the_upstream_call_and_frees_its_slot(
    runtime_service, fake_bin, tmp_path, state_dir
):
    model = managed("vllm_serve", fake_bin, tmp_path, env={"FAKE_TOKEN_DELAY_MS": "200"}, request_timeout_seconds=1.5)
    service, _ = await runtime_service({"m": model})
    await service.op_load({"name": "m", "body": {}}, None)
    controller = service.pool.controller("m")
    chunks: list[dict] = []

    async def emit(event: dict) -> None:
        chunks.append(event)

    words = {"messages": [{"role": "user", "content": " ".join(["w"] * 40)}], "stream": True, "user": "bob"}
    payload = request_for("m", "r1", **words)
    task = asyncio.create_task(service.op_generate(payload, emit))
    await eventually(lambda: len(chunks) >= 3, message="the stream under way")
    assert controller.scheduler.inflight == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: controller.scheduler.inflight == 0, message="the slot freed")
    # No usage came: charged the prompt estimate and a token per chunk that came, which the last
    # event (``cancelled``) tells the edge, for the key's usage.
    estimate = estimate_prompt_tokens(GenerationRequest.from_wire(payload))
    came = sum(1 for chunk in chunks if chunk.get("event") == "upstream")
    assert controller.scheduler.keys["bob"].counter == estimate + came
    assert chunks[-1] == {"event": "cancelled", "usage": {"input_tokens": estimate, "output_tokens": came}}
    # The fake server's next write found the connection closed.
    log = state_dir / "logs" / "m.r0.log"
    await eventually(lambda: any(error in log.read_text() for error in ("BrokenPipeError", "ConnectionResetError")),
                     message="the upstream saw its connection closed")

    # The request timeout cancels a forwarded request too.
    with pytest.raises(RequestTimeout):
        await service.op_generate(request_for("m", "r2", **{**words, "stream": False}), emit)
    await eventually(lambda: controller.scheduler.inflight == 0, message="the slot freed")
