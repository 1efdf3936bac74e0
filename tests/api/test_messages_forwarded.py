"""POST /v1/messages on a model whose engine forwards OpenAI bodies upstream (openai_remote here; the
managed servers share the same client): the upstream gets the typed request as a chat completions
body (system turn, tools, max_tokens), never the Anthropic body, and the answer comes back in
Anthropic's shapes; a max_tokens past the upstream's context is clamped, never refused; a token
count there is 400 token_count_unsupported."""
from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import anthropic
import pytest

from tests.conftest import forwarding_service, serving_http

ANSWER = "forwarded answer"
CONTEXT = 4096  # the upstream's model length, which it refuses a prompt plus max_tokens past (as vLLM)


class Upstream(BaseHTTPRequestHandler):
    """An OpenAI-compatible /v1/chat/completions that records each body it gets."""

    bodies: list[dict] = []

    def log_message(self, *args) -> None:
        pass

    def _send(self, content_type: str, data: bytes, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        Upstream.bodies.append({"path": self.path, **body})
        if self.path != "/v1/chat/completions":
            self.send_error(404)
            return
        if body.get("max_tokens", 0) + 7 > CONTEXT or "too long" in json.dumps(body["messages"]):
            message = (f"'max_tokens' or 'max_completion_tokens' is too large: {body.get('max_tokens')}. This model's "
                       f"maximum context length is {CONTEXT} tokens and your request has 7 input tokens")
            error = {"error": {"message": message, "type": "BadRequestError", "code": 400}}
            self._send("application/json", json.dumps(error).encode(), 400)
            return
        usage = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
        head = {"id": "chatcmpl-up", "created": 1, "model": body["model"]}
        if not body.get("stream"):
            choice = {"index": 0, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}
            self._send("application/json", json.dumps({**head, "object": "chat.completion", "choices": [choice],
                                                       "usage": usage}).encode())
            return
        chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": word}, "finish_reason": None}]}
                  for word in ("forwarded", " answer")]
        chunks += [{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, {"choices": [], "usage": usage}]
        events = b"".join(f"data: {json.dumps({**head, 'object': 'chat.completion.chunk', **c})}\n\n".encode()
                          for c in chunks)
        self._send("text/event-stream", events + b"data: [DONE]\n\n")


@pytest.fixture(scope="module")
def upstream():
    with serving_http(Upstream) as server:
        yield server


@pytest.fixture(scope="module")
def client(tmp_path_factory, api_shape, upstream):
    with forwarding_service(tmp_path_factory.mktemp("messages_forwarded"), upstream.server_port) as live:
        with anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0, timeout=60) as client:
            yield client


def test_the_upstream_gets_a_chat_completions_body(client):
    Upstream.bodies.clear()
    message = client.messages.create(model="remote", max_tokens=50, system="be brief",
                                     messages=[{"role": "user", "content": "hello"}])
    assert (message.model, message.content[0].text, message.stop_reason) == ("remote", ANSWER, "end_turn")
    assert (message.usage.input_tokens, message.usage.output_tokens) == (7, 2)
    (sent,) = Upstream.bodies
    assert sent["path"] == "/v1/chat/completions" and sent["model"] == "upstream-model"
    assert sent["max_tokens"] == 50 and "system" not in sent
    assert [m["role"] for m in sent["messages"]] == ["system", "user"]
    with client.messages.stream(model="remote", max_tokens=50, messages=[{"role": "user", "content": "hi"}]) as stream:
        assert "".join(stream.text_stream) == ANSWER
    assert Upstream.bodies[-1]["stream"] is True and "messages" in Upstream.bodies[-1]


def test_a_token_count_there_is_refused(client):
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.count_tokens(model="remote", messages=[{"role": "user", "content": "x"}])
    assert caught.value.body["error"]["code"] == "token_count_unsupported"


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_past_the_upstreams_context_is_clamped(client, stream):
    """Claude Code's 32000 on a model of 4096: the upstream refuses it, and is asked without it (its
    output limit is then the room left); a prompt too long for the context is refused still."""
    Upstream.bodies.clear()
    ask = {"model": "remote", "max_tokens": 32000, "messages": [{"role": "user", "content": "hello"}]}
    if stream:
        with client.messages.stream(**ask) as answer:
            assert "".join(answer.text_stream) == ANSWER
    else:
        assert client.messages.create(**ask).content[0].text == ANSWER
    refused, clamped = Upstream.bodies
    assert refused["max_tokens"] == 32000 and "max_tokens" not in clamped
    assert {**clamped, "max_tokens": 32000} == refused
    Upstream.bodies.clear()
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(**{**ask, "messages": [{"role": "user", "content": "too long"}]})
    assert caught.value.body["error"]["code"] == "context_length_exceeded" and len(Upstream.bodies) == 2
