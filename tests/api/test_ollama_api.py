"""Ollama's API (/api/*) against a live service on stub models, with the official ``ollama``
client and by hand (VS Code Copilot's probe): version, tags, show, ps, chat (plain, streamed,
thinking, tools, images, format), generate, embed, the load wait of an NDJSON stream, errors in
Ollama's shape, inference keys.  Every object is validated strictly against the client's own
pydantic models: no key they do not declare, every value of their types."""
from __future__ import annotations

import base64
import hashlib
import json
import math
import typing

import httpx
import ollama
import pydantic
import pytest
from ollama._types import ChatResponse, EmbedResponse, GenerateResponse, ListResponse, ProcessResponse, ShowResponse

from tests.conftest import service_with_loaded_models

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 24).decode()
KEY = "key-ollama-0123456789"
WEATHER = {"city": "Paris", "unit": "C"}
MODELS = {
    "echo": {"backend": "stub", "modalities": ["text", "image"], "thinking_modes": ["default", "enabled", "disabled"],
             "stub_reasoning": "Let me think", "stub_context_length": 8192, "aliases": ["echo-alias"],
             "ttl_seconds": 600},
    "agent": {"backend": "stub", "stub_tool_calls": [{"name": "get_weather", "arguments": WEATHER}],
              "stub_reply": "It is sunny"},
    "vectors": {"backend": "stub", "embeddings": True, "stub_embedding_dimensions": 8},
    "shaped": {"backend": "stub", "response_formats": ["text", "json_schema"], "stub_reply": '{"a": 1}'},
    "cold": {"backend": "stub", "load_on_request": True, "stub_load_seconds": 3.5, "stub_reply": "warm now"},
    "breaking": {"backend": "stub", "stub_reply": "one two three", "stub_fail_after_tokens": 1},
}
ECHO_ONLY_KEY = "key-ollama-echo-only-0123"
API_KEYS = [{"name": "all", "key_sha256": hashlib.sha256(KEY.encode()).hexdigest(), "models": "*"},
            {"name": "echo-only", "key_sha256": hashlib.sha256(ECHO_ONLY_KEY.encode()).hexdigest(), "models": ["echo"]}]


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    with service_with_loaded_models(tmp_path_factory.mktemp("ollama"), MODELS, service={"api_keys": API_KEYS}) as live:
        yield live


@pytest.fixture
def http(service):
    with service.client(headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as client:
        yield client


@pytest.fixture
def client(service):
    return ollama.Client(host=service.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)


# Keys of Ollama's own api/types.go that the Python client's models leave out.
GO_ONLY = {"ListResponse.Model": {"name"}}


def strictly(model: type[pydantic.BaseModel], data: dict):
    """``data`` as the client's ``model``, after checking that every key, at every depth, is one
    the model declares (its fields by name or alias; or Ollama's Go types, ``GO_ONLY``)."""
    _declared_only(model, data, "$")
    return model.model_validate(data)


def _declared_only(model: type[pydantic.BaseModel], data, where: str) -> None:
    assert isinstance(data, dict), f"{where} is not an object"
    fields = {field.alias or name: field for name, field in model.model_fields.items()}
    for key, value in data.items():
        if key in GO_ONLY.get(model.__qualname__, ()):
            continue
        assert key in fields, f"{where}.{key} is not a field of {model.__qualname__}"
        for inner in _models_in(fields[key].annotation):
            items = value if isinstance(value, list) else [value]
            for index, item in enumerate(items):
                if isinstance(item, dict):
                    _declared_only(inner, item, f"{where}.{key}[{index}]")


def _models_in(annotation) -> list[type[pydantic.BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def lines(answer: httpx.Response) -> list[dict]:
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/x-ndjson"
    return [json.loads(line) for line in answer.text.splitlines()]


# -- the model listings ----------------------------------------------------------------------
def test_copilots_probe_version_tags_and_show(http):
    version = http.get("/api/version").json()["version"]
    assert tuple(int(part) for part in version.split(".")) >= (0, 6, 4)
    listed = strictly(ListResponse, http.get("/api/tags").json())
    names = [model.model for model in listed.models]
    assert {"echo", "echo-alias", "agent", "vectors", "cold"} <= set(names)
    shown = http.post("/api/show", json={"model": "echo"}).json()
    info = shown["model_info"]
    assert info[f"{info['general.architecture']}.context_length"] == 8192
    assert "vision" in shown["capabilities"]
    strictly(ShowResponse, shown)


def test_show_names_each_models_capabilities(client):
    assert client.show("echo").capabilities == ["completion", "thinking", "vision"]
    assert client.show("agent").capabilities == ["completion", "tools"]
    assert client.show("vectors").capabilities == ["completion", "embedding"]
    shown = client.show("echo-alias")
    assert shown.modelinfo["stub.context_length"] == 8192 and shown.parameters == "num_ctx 8192"
    assert shown.modelinfo["general.basename"] == "echo-alias"  # Copilot's display name
    assert "stub.context_length" not in client.show("agent").modelinfo  # no context known


def test_tags_details_and_the_context_length_in_v1_models(client, http):
    echo = next(model for model in client.list().models if model.model == "echo")
    assert echo.details.family == "stub" and echo.details.format == "stub" and len(echo.digest) == 64
    listed = {model["id"]: model for model in http.get("/v1/models").json()["data"]}
    assert listed["echo"]["context_length"] == listed["echo-alias"]["context_length"] == 8192
    assert listed["agent"]["context_length"] is None


def test_ps_lists_the_loaded_models_with_their_expiry(http):
    running = strictly(ProcessResponse, http.get("/api/ps").json())
    by_name = {model.name: model for model in running.models}
    assert "cold" not in by_name and {"echo", "agent", "vectors"} <= set(by_name)
    assert by_name["echo"].context_length == 8192
    assert by_name["echo"].expires_at.year < 9999  # ttl_seconds 600
    assert by_name["agent"].expires_at.year == 9999  # no ttl: never


def test_keep_alive_is_ignored_unless_the_operator_allows_it(http):
    """service.ollama_keep_alive is off here: no client unloads (or pins) a model of a shared pool."""
    answer = http.post("/api/generate", json={"model": "agent", "prompt": "hi", "stream": False, "keep_alive": 0})
    assert answer.status_code == 200, answer.text
    running = {model["name"]: model for model in http.get("/api/ps").json()["models"]}
    assert "agent" in running and running["agent"]["expires_at"].startswith("9999")


# -- chat and generate ------------------------------------------------------------------------
def test_chat_answers_one_object_with_its_durations(client):
    answer = client.chat(model="echo", messages=[{"role": "user", "content": "hello there"}], stream=False,
                         think=False)
    assert answer.message.content == "hello there" and answer.message.thinking is None
    assert answer.done and answer.done_reason == "stop"
    assert (answer.prompt_eval_count, answer.eval_count) == (2, 2)
    assert answer.total_duration >= answer.prompt_eval_duration + answer.eval_duration > 0
    assert answer.load_duration == 0


def test_chat_streams_ndjson_validated_line_by_line(http):
    objects = lines(http.post("/api/chat", json={"model": "echo", "think": True,
                                                 "messages": [{"role": "user", "content": "one two three"}]}))
    for data in objects:
        strictly(ChatResponse, data)
    assert "".join(o["message"].get("thinking", "") for o in objects) == "Let me think"
    assert "".join(o["message"]["content"] for o in objects) == "one two three"
    assert [o["done"] for o in objects] == [False] * (len(objects) - 1) + [True]
    assert objects[-1]["done_reason"] == "stop" and objects[-1]["eval_count"] > 0


def test_chat_with_the_client_streaming_and_the_length_limit(client):
    pieces = list(client.chat(model="echo", messages=[{"role": "user", "content": "a b c d e"}], stream=True,
                              think=False, options={"num_predict": 2, "num_ctx": 1_000_000, "mirostat": 0}))
    assert "".join(piece.message.content for piece in pieces) == "a b"
    assert pieces[-1].done_reason == "length"


def test_stop_seed_and_logprobs_reach_the_engine(client, http):
    answer = client.chat(model="echo", messages=[{"role": "user", "content": "one two three"}], stream=False,
                         think=False, options={"stop": [" three"], "seed": 7}, logprobs=True, top_logprobs=1)
    assert answer.message.content == "one two"
    assert [entry.token for entry in answer.logprobs] == ["one", " two"]
    assert all(entry.logprob == 0.0 and entry.top_logprobs[0].token == entry.token for entry in answer.logprobs)
    objects = lines(http.post("/api/generate", json={"model": "echo", "prompt": "a b", "think": False,
                                                     "logprobs": True}))
    for data in objects:
        strictly(GenerateResponse, data)
    assert [entry["token"] for data in objects for entry in data.get("logprobs", ())] == ["a", " b"]


def test_an_error_after_the_stream_started_is_its_last_line(client, http):
    objects = lines(http.post("/api/chat", json={"model": "breaking",
                                                 "messages": [{"role": "user", "content": "x"}]}))
    assert objects[0]["message"]["content"] == "one" and objects[-1]["code"] == "backend_error"
    assert set(objects[-1]) == {"error", "code"}
    with pytest.raises(ollama.ResponseError) as failed:
        list(client.chat(model="breaking", messages=[{"role": "user", "content": "x"}], stream=True))
    assert "stub engine failed" in failed.value.error


def test_tools_out_and_results_in(client):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    answer = client.chat(model="agent", messages=messages, tools=tools, stream=False)
    [call] = answer.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == WEATHER
    streamed = [piece for piece in client.chat(model="agent", messages=messages, tools=tools, stream=True)
                if piece.message.tool_calls]
    assert streamed[0].message.tool_calls[0].function.arguments == WEATHER
    messages += [answer.message, {"role": "tool", "content": "sunny, 21", "tool_name": "get_weather"}]
    assert client.chat(model="agent", messages=messages, tools=tools, stream=False).message.content == "It is sunny"


def test_images_reach_a_model_that_sees_and_are_refused_by_one_that_does_not(client):
    answer = client.chat(model="echo", messages=[{"role": "user", "content": "what is it", "images": [PNG]}],
                         stream=False, think=False)
    assert answer.message.content == "what is it"
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model="agent", messages=[{"role": "user", "content": "what", "images": [PNG]}], stream=False)
    assert refused.value.status_code == 400 and "image" in refused.value.error


def test_format_runs_on_a_model_that_keeps_to_one_and_a_stream_is_then_one_object(http, client):
    objects = lines(http.post("/api/chat", json={"model": "shaped", "format": "json",
                                                 "messages": [{"role": "user", "content": "give json"}]}))
    assert len(objects) == 1 and objects[0]["done"] and json.loads(objects[0]["message"]["content"]) == {"a": 1}
    strictly(ChatResponse, objects[0])
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model="echo", messages=[{"role": "user", "content": "x"}], format="json")
    assert refused.value.status_code == 400


def test_generate_plain_streamed_and_raw(client, http):
    answer = client.generate(model="echo", prompt="tell me", think=False)
    assert answer.response == "tell me" and answer.done and answer.eval_count == 2
    strictly(GenerateResponse, http.post("/api/generate", json={"model": "echo", "prompt": "x", "stream": False}).json())
    objects = lines(http.post("/api/generate", json={"model": "echo", "prompt": "s t", "think": False}))
    for data in objects:
        strictly(GenerateResponse, data)
    assert "".join(o["response"] for o in objects) == "s t"
    assert client.generate(model="agent", prompt="Once upon", raw=True).response == "It is sunny"


def test_a_body_without_messages_only_loads(http):
    data = http.post("/api/chat", json={"model": "echo", "messages": [], "stream": False}).json()
    assert data["done"] and data["done_reason"] == "load"
    strictly(ChatResponse, data)
    assert http.post("/api/generate", json={"model": "nope"}).status_code == 404


def test_a_stream_waiting_for_its_models_load_stays_open_with_empty_objects(http):
    objects = lines(http.post("/api/chat", json={"model": "cold", "messages": [{"role": "user", "content": "hi"}]},
                              timeout=30))
    waiting = [o for o in objects if not o["done"] and o["message"]["content"] == ""]
    assert len(waiting) >= 2  # one at once, one after 3 s of the 3.5 s load
    for data in objects:
        strictly(ChatResponse, data)
    assert "".join(o["message"]["content"] for o in objects) == "warm now"
    assert objects[-1]["load_duration"] > 3e9


# -- embeddings -------------------------------------------------------------------------------
def _stub_vector(text: str, dims: int = 8) -> list[float]:
    raw = [(byte - 127.5) / 127.5 for byte in hashlib.shake_256(text.encode()).digest(dims)]
    norm = math.sqrt(sum(value * value for value in raw))
    return [value / norm for value in raw]


def test_embed_and_the_older_embeddings(client, http):
    answer = strictly(EmbedResponse, http.post("/api/embed", json={"model": "vectors", "input": ["a", "b c"]}).json())
    assert len(answer.embeddings) == 2
    assert list(answer.embeddings[0]) == pytest.approx(_stub_vector("a"))
    assert list(answer.embeddings[1]) == pytest.approx(_stub_vector("b c"))
    assert answer.prompt_eval_count == 3
    assert list(client.embed(model="vectors", input="a").embeddings[0]) == pytest.approx(_stub_vector("a"))
    assert list(client.embeddings(model="vectors", prompt="a").embedding) == pytest.approx(_stub_vector("a"))
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model="echo", input="a")
    assert refused.value.status_code == 400


# -- errors and keys --------------------------------------------------------------------------
def test_an_unknown_model_is_a_404_in_ollamas_shape(client, http):
    for call in (lambda: client.show("nope"), lambda: client.chat(model="nope", messages=[{"role": "user", "content": "x"}]),
                 lambda: client.embed(model="nope", input="x")):
        with pytest.raises(ollama.ResponseError) as refused:
            call()
        assert refused.value.status_code == 404
    answer = http.post("/api/chat", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})
    assert answer.json() == {"error": answer.json()["error"], "code": "unknown_model"}


def test_bad_bodies_and_methods_are_refused_in_ollamas_shape(http):
    answer = http.post("/api/chat", json={"model": "echo", "messages": [{"role": "robot", "content": "x"}]})
    assert answer.status_code == 400 and answer.json()["code"] == "invalid_request"
    assert "messages[0].role" in answer.json()["error"]
    assert http.post("/api/tags").status_code == 405 and http.get("/api/chat").json()["code"] == "method_not_allowed"


def test_model_management_says_models_are_declared_in_settings(client, http):
    with pytest.raises(ollama.ResponseError) as refused:
        client.pull("llama3.2")
    assert refused.value.status_code == 405 and "settings.json" in refused.value.error
    for path in ("/api/push", "/api/create", "/api/copy"):
        assert http.post(path, json={"model": "x"}).json()["code"] == "model_management_unsupported"
    assert http.request("DELETE", "/api/delete", json={"model": "echo"}).status_code == 405


def test_inference_keys_apply_to_every_ollama_path(service):
    with service.client() as anonymous:
        for method, path in (("GET", "/api/version"), ("GET", "/api/tags"), ("POST", "/api/chat")):
            answer = anonymous.request(method, path, json={})
            assert answer.status_code == 401 and answer.json()["code"] == "invalid_api_key"


@pytest.mark.parametrize(("path", "body", "endpoint"), [
    ("/api/chat", {"model": "agent", "messages": [{"role": "user", "content": "count me"}], "stream": False},
     "ollama_chat"),
    ("/api/generate", {"model": "agent", "prompt": "count me", "stream": False}, "ollama_generate"),
    ("/api/embed", {"model": "vectors", "input": "count me"}, "ollama_embed"),
    ("/api/embeddings", {"model": "vectors", "prompt": "count me"}, "ollama_embeddings"),
])
def test_each_path_is_labelled_in_activity_and_metrics_and_charged_to_its_keys_bucket(service, http, path, body,
                                                                                       endpoint):
    fairness_header = {"X-LLMPool-Fairness-Key": "not-mine"}  # a key's bucket decides, whatever a header says
    assert http.post(path, json=body, headers=fairness_header).status_code == 200
    (newest,) = http.get("/v1/admin/activity", params={"model": body["model"], "limit": 1}).json()["requests"]
    assert (newest["endpoint"], newest["fairness_key"], newest["status"]) == (endpoint, "all", 200)
    assert f'endpoint="{endpoint}"' in http.get("/metrics").text
    with service.client(headers={"Authorization": f"Bearer {ECHO_ONLY_KEY}"}, timeout=30) as narrow:
        refused = narrow.post(path, json=body)
    assert refused.status_code == 403 and refused.json()["code"] == "model_not_allowed"
