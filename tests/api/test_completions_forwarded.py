"""POST /v1/completions on a model that forwards the client's body (openai_remote here; the managed
servers share runtime.backends.shared.forwarding): the upstream's own /v1/completions gets the body as the
client sent it (model renamed, include_usage forced on a stream), so fields the typed path refuses
(several prompts, n, echo, top_k ...) are the upstream's to judge, and its answer and chunks come
back as it wrote them, with the client's model name; validated strictly with openai's Completion."""
from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import openai
import pytest
from openai.types import Completion

from tests.conftest import forwarding_service, serving_http


class Upstream(BaseHTTPRequestHandler):
    """An OpenAI-compatible /v1/completions that records each body it gets."""

    bodies: list[dict] = []

    def log_message(self, *args) -> None:
        pass

    @staticmethod
    def _answer(model: str, fields: dict) -> dict:
        return {"id": "cmpl-up", "object": "text_completion", "created": 1, "model": model, **fields}

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        Upstream.bodies.append({"path": self.path, **body})
        if self.path != "/v1/completions":
            self.send_error(404)
            return
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        choices = [{"text": f" up{i}", "index": i, "logprobs": None, "finish_reason": "stop"} for i in range(len(prompts))]
        usage = {"prompt_tokens": 3, "completion_tokens": len(prompts), "total_tokens": 3 + len(prompts)}
        if not body.get("stream"):
            data = json.dumps(self._answer(body["model"], {"choices": choices, "usage": usage})).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        events = [{"choices": [{**choices[0], "finish_reason": None}]}, {"choices": [{**choices[0], "text": ""}]}]
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({"choices": [], "usage": usage})
        for event in events:
            self.wfile.write(f"data: {json.dumps(self._answer(body['model'], event))}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture(scope="module")
def upstream():
    with serving_http(Upstream) as server:
        yield server


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape, upstream):
    with forwarding_service(tmp_path_factory.mktemp("completions_forwarded"), upstream.server_port) as live:
        yield live


@pytest.fixture
def client(service):
    Upstream.bodies.clear()
    with openai.OpenAI(base_url=service.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def test_the_model_takes_raw_prompts_through_its_upstream(http):
    [item] = http.get("/v1/models").json()["data"]
    assert item["capabilities"]["raw_prompt"] is True


def test_the_body_is_forwarded_as_sent_and_the_answer_comes_back(client):
    answer = client.completions.create(model="remote", prompt=["one", "two"], n=1, echo=True, max_tokens=4,
                                       extra_body={"top_k": 5})
    Completion.model_validate(answer.model_dump(exclude_unset=True), strict=True)
    assert (answer.id, answer.model) == ("cmpl-up", "remote")
    assert [choice.text for choice in answer.choices] == [" up0", " up1"]
    assert answer.usage.total_tokens == 5
    [sent] = Upstream.bodies
    assert sent == {"path": "/v1/completions", "model": "upstream-model", "prompt": ["one", "two"], "n": 1,
                    "echo": True, "max_tokens": 4, "top_k": 5}


def test_a_stream_is_relayed_chunk_by_chunk(client):
    chunks = list(client.completions.create(model="remote", prompt="one", stream=True))
    assert [chunk.choices[0].text for chunk in chunks] == [" up0", ""]
    assert [chunk.choices[0].finish_reason for chunk in chunks] == [None, "stop"]
    assert {chunk.model for chunk in chunks} == {"remote"}
    assert all(chunk.usage is None for chunk in chunks)  # the client did not ask for it
    [sent] = Upstream.bodies
    assert sent["stream_options"] == {"include_usage": True}  # asked for, to count the tokens
    with_usage = list(client.completions.create(model="remote", prompt="one", stream=True,
                                                stream_options={"include_usage": True}))
    assert with_usage[-1].choices == [] and with_usage[-1].usage.total_tokens == 4
