"""Ollama's /api/chat on a model whose engine forwards OpenAI bodies (openai_remote here; the
managed servers share the path): the upstream gets a chat-completions body the engine wrote from
the typed request (the conversation, tools, sampling mapped), never Ollama's body (no ``options``,
``think``, ``keep_alive``), and its answer comes back in Ollama's shape, streamed or not."""
from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import ollama
import pytest

from tests.conftest import forwarding_service, serving_http


class Upstream(BaseHTTPRequestHandler):
    """An OpenAI-compatible /v1/chat/completions that records each body and answers "up there"."""

    bodies: list[dict] = []

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        Upstream.bodies.append({"path": self.path, **body})
        usage = {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
        base = {"id": "c1", "created": 1, "model": body["model"]}
        if not body.get("stream"):
            answer = {**base, "object": "chat.completion", "usage": usage, "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "up there"}, "finish_reason": "stop"}]}
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        chunks = [{"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                  for piece in ("up", " there")]
        chunks += [{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, {"choices": [], "usage": usage}]
        for chunk in chunks:
            event = {**base, "object": "chat.completion.chunk", **chunk}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture(scope="module")
def upstream():
    with serving_http(Upstream) as server:
        yield server


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape, upstream):
    with forwarding_service(tmp_path_factory.mktemp("ollama_forwarded"), upstream.server_port) as live:
        yield live


@pytest.mark.parametrize("stream", [False, True])
def test_the_upstream_gets_the_typed_request_never_the_ollama_body(service, stream):
    Upstream.bodies.clear()
    client = ollama.Client(host=service.url, timeout=30)
    answer = client.chat(model="remote", messages=[{"role": "system", "content": "Be brief"},
                                                   {"role": "user", "content": "Where?"}],
                         options={"temperature": 0.3, "num_predict": 9, "seed": 5, "presence_penalty": 0.5},
                         keep_alive="5m", stream=stream)
    pieces = list(answer) if stream else [answer]
    assert "".join(piece.message.content for piece in pieces) == "up there"
    assert pieces[-1].done and pieces[-1].eval_count == 2 and pieces[-1].prompt_eval_count == 4
    [body] = Upstream.bodies
    assert body["path"] == "/v1/chat/completions" and body["model"] == "upstream-model"
    assert body["messages"] == [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Where?"}]
    assert body["temperature"] == 0.3 and body["max_tokens"] == 9
    assert body["seed"] == 5 and body["presence_penalty"] == 0.5
    assert not {"options", "think", "keep_alive", "format", "top_k"} & set(body)


def test_an_option_openai_has_not_is_refused_before_the_upstream(service):
    """OpenAI's API has no top_k or repeat_penalty: openai_remote's sampling_options leave them out."""
    Upstream.bodies.clear()
    client = ollama.Client(host=service.url, timeout=30)
    for option in ({"top_k": 3}, {"repeat_penalty": 1.2}):
        with pytest.raises(ollama.ResponseError) as refused:
            client.chat(model="remote", messages=[{"role": "user", "content": "Where?"}], options=option, stream=False)
        assert refused.value.status_code == 400 and next(iter(option)) in refused.value.error
    assert Upstream.bodies == []
