"""Ollama's bodies translated onto the typed request (models_app.api.ollama.protocol): messages
(images, tool calls and their results), options, think, format, and the 400s naming the field."""
from __future__ import annotations

import base64
import json

import pytest

from models_app.api.ollama.protocol import (
    keep_alive_seconds,
    parse_chat,
    parse_embed,
    parse_embeddings,
    parse_generate,
    shown_model,
)
from runtime.errors import InvalidRequest
from runtime.inputs.request import GenerationRequest

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 24).decode()
JPEG = base64.b64encode(b"\xff\xd8\xff\xe0" + b"\x00" * 24).decode()


def chat(**fields):
    return parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}, None)


def refused(parse, body: dict) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        parse(body, None)
    return caught.value


def test_a_chat_is_the_typed_request_streamed_by_default_and_never_a_passthrough():
    call = chat()
    assert call.stream is True and call.model == "m"
    request = call.generation
    assert request.stream is True and type(request) is GenerationRequest
    assert request.messages == [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
    assert chat(stream=False).generation.stream is False


def test_options_map_onto_the_typed_fields_and_the_others_change_nothing():
    request = chat(options={
        "num_predict": 7, "temperature": 0.2, "top_p": 0.9, "seed": 42, "stop": ["\n", ""],
        "presence_penalty": 0.5, "frequency_penalty": 0.0, "num_ctx": 1_000_000, "top_k": 40,
        "repeat_penalty": 1.1, "mirostat": 0, "unknown_option": "x",
    }).generation
    assert (request.max_output_tokens, request.temperature, request.top_p, request.seed) == (7, 0.2, 0.9, 42)
    assert request.stop == ["\n"] and request.presence_penalty == 0.5 and request.frequency_penalty is None
    assert (request.top_k, request.repeat_penalty) == (40, 1.1)
    # top_k 0 keeps every token and repeat_penalty 1 penalises nothing: no option for the engine to honour.
    neutral = chat(options={"top_k": 0, "repeat_penalty": 1.0}).generation
    assert (neutral.top_k, neutral.repeat_penalty) == (None, None)
    # -1 (no limit) and -2 (fill the context) leave the service's default.
    assert chat(options={"num_predict": -1}).generation.max_output_tokens is None
    assert chat(options={"num_predict": -2}).generation.max_output_tokens is None


@pytest.mark.parametrize(("think", "thinking", "effort"), [
    (True, "enabled", None), (False, "disabled", None), ("high", None, "high"), (None, None, None),
])
def test_think_is_a_thinking_mode_or_a_reasoning_effort(think, thinking, effort):
    request = chat(think=think).generation
    assert (request.thinking, request.reasoning_effort) == (thinking, effort)


def test_format_json_is_an_objects_schema_and_runs_the_request_whole():
    call = chat(format="json")
    assert call.stream is True and call.generation.stream is False
    assert call.generation.response_format == {
        "type": "json_schema", "json_schema": {"name": "ollama_format", "schema": {"type": "object"}}}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert chat(format=schema).generation.response_format["json_schema"]["schema"] == schema
    assert chat(format="").generation.response_format is None


def test_images_become_data_urls_of_their_type():
    call = parse_chat({"model": "m", "messages": [{"role": "user", "content": "what", "images": [PNG, JPEG]}]}, None)
    parts = call.generation.messages[0]["content"]
    assert parts[1] == {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"}
    assert parts[2]["image_url"].startswith("data:image/jpeg;base64,")


def test_tool_calls_are_numbered_and_results_answer_the_oldest_call_of_their_name():
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"function": {"name": "get_time", "arguments": {}}},
        ]},
        {"role": "tool", "content": "12:00", "tool_name": "get_time"},
        {"role": "tool", "content": "sunny"},
    ]
    typed = parse_chat({"model": "m", "messages": messages,
                        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]},
                       None).generation
    assert typed.messages[1]["tool_calls"] == [
        {"id": "call_1_0", "name": "get_weather", "arguments": json.dumps({"city": "Paris"})},
        {"id": "call_1_1", "name": "get_time", "arguments": "{}"},
    ]
    assert typed.messages[1]["content"] == []
    assert [m.get("tool_call_id") for m in typed.messages[2:]] == ["call_1_1", "call_1_0"]
    assert typed.tools == [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


def test_a_generate_prompt_is_a_user_turn_and_a_raw_one_the_raw_prompt():
    request = parse_generate({"model": "m", "prompt": "Say hi", "system": "Be brief"}, None).generation
    assert [m["role"] for m in request.messages] == ["system", "user"] and request.prompt is None
    raw = parse_generate({"model": "m", "prompt": "Once upon", "raw": True}, None).generation
    assert raw.prompt == "Once upon" and raw.messages == []


def test_a_body_without_messages_or_prompt_only_loads():
    assert parse_chat({"model": "m"}, None).generation is None
    assert parse_generate({"model": "m", "prompt": ""}, None).generation is None


@pytest.mark.parametrize(("parse", "body", "param"), [
    (parse_chat, {"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    (parse_chat, {"model": "m", "messages": [], "options": {"temperature": "hot"}}, "options.temperature"),
    (parse_chat, {"model": "m", "messages": [], "stream": "yes"}, "stream"),
    (parse_chat, {"model": "m", "messages": [{"role": "user", "content": ""}]}, "messages[0].images"),
    (parse_chat, {"model": "m", "messages": [{"role": "user", "content": "x", "images": ["not base64!"]}]},
     "messages[0].images[0]"),
    (parse_chat, {"model": "m", "messages": [{"role": "user", "content": "x",
                                              "images": [base64.b64encode(b"plain text").decode()]}]},
     "messages[0].images[0]"),
    (parse_chat, {"model": "m", "messages": [], "think": "extreme"}, "think"),
    (parse_chat, {"model": "", "messages": []}, "model"),
    (parse_generate, {"model": "m", "prompt": "x", "suffix": "y"}, "suffix"),
    (parse_generate, {"model": "m", "prompt": "x", "context": [1, 2]}, "context"),
    (parse_embed, {"model": "m", "input": []}, "input"),
    (parse_embed, {"model": "m", "input": ["a", ""]}, "input"),
    (parse_embeddings, {"model": "m", "prompt": ""}, "prompt"),
])
def test_a_bad_body_is_a_400_naming_its_field(parse, body, param):
    assert refused(parse, body).param == param


def test_embed_takes_a_string_or_a_batch_and_show_a_model_or_a_name():
    assert parse_embed({"model": "m", "input": "one"}, None).inputs == ["one"]
    assert parse_embed({"model": "m", "input": ["a", "b"], "dimensions": 4}, None).dimensions == 4
    assert parse_embeddings({"model": "m", "prompt": "p"}, None).inputs == ["p"]
    assert shown_model({"model": "a"}) == "a" and shown_model({"name": "b"}) == "b"
    with pytest.raises(InvalidRequest):
        shown_model({})


def test_created_at_is_iso_utc_with_microseconds_and_the_time_now():
    from datetime import datetime, timezone

    from models_app.api.ollama.shapes import now_iso

    stamps = [now_iso() for _ in range(3)]
    parsed = [datetime.fromisoformat(stamp.replace("Z", "+00:00")) for stamp in stamps]
    assert all(stamp.endswith("Z") and len(stamp) == len("2026-01-01T00:00:00.000000Z") for stamp in stamps)
    assert parsed == sorted(parsed) and abs((datetime.now(timezone.utc) - parsed[-1]).total_seconds()) < 1



@pytest.mark.parametrize(("value", "seconds"), [
    (None, None), (0, 0.0), (300, 300.0), (-1, -1.0), ("0", 0.0), ("600", 600.0), ("5m", 300.0),
    ("1h30m", 5400.0), ("-1m", -60.0), ("1.5s", 1.5), ("250ms", 0.25),
])
def test_keep_alive_reads_as_seconds(value, seconds):
    assert keep_alive_seconds(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 minutes", "m", "", "5m soon"])
def test_a_keep_alive_that_is_no_duration_is_refused(value):
    with pytest.raises(InvalidRequest) as refused:
        keep_alive_seconds(value)
    assert refused.value.param == "keep_alive"
