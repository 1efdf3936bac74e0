"""The Messages body's translation onto the typed request (models_app.api.messages.protocol), block by
block, and its refusals; the fairness key ``metadata.user_id`` gives where the operator lets it."""
from __future__ import annotations

import json

import pytest

from models_app.api.messages.protocol import parse_count_tokens_body, parse_messages_body
from models_app.conf import service_settings
from runtime.errors import FairnessKeyTooLong, InvalidRequest
from runtime.inputs.request import GenerationRequest

TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def body(**fields) -> dict:
    return {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], **fields}


@pytest.fixture
def metadata_fairness(settings, tmp_path):
    """service.fairness_key_from_metadata on (the API reads its settings once)."""
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"service": {"fairness_key_from_metadata": True}, "models": {}}))
    settings.LLMPOOL_SETTINGS = str(path)
    service_settings.cache_clear()
    yield
    service_settings.cache_clear()


def test_system_blocks_system_turns_tool_results_and_images_in_the_typed_shape():
    request = parse_messages_body(body(
        system=[{"type": "text", "text": "one", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "two"}],
        messages=[
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                       "data": "AAAA"}},
                                         {"type": "text", "text": "what is it?"}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                              {"type": "text", "text": "let me look"},
                                              {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}}]},
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "rain"},
                                         {"type": "text", "text": "and now?"}]},
        ],
        tools=[TOOL],
    ), None).generation
    assert request.messages == [
        {"role": "system", "content": [{"type": "input_text", "text": "one\n\ntwo"}]},
        {"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                                     {"type": "input_text", "text": "what is it?"}]},
        {"role": "assistant", "content": [{"type": "input_text", "text": "let me look"}],
         "tool_calls": [{"id": "t1", "name": "get_weather", "arguments": '{"city":"Oslo"}'}]},
        {"role": "system", "content": [{"type": "input_text", "text": "be brief"}]},
        {"role": "tool", "tool_call_id": "t1", "content": [{"type": "input_text", "text": "rain"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "and now?"}]},
    ]
    assert request.tools == [{"type": "function", "function": {"name": "get_weather", "parameters": TOOL["input_schema"]}}]
    assert (request.max_output_tokens, type(request), request.fairness_key) == (64, GenerationRequest, None)


@pytest.mark.parametrize(("choice", "typed", "parallel"), [
    ({"type": "auto"}, "auto", None),
    ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
    ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}, None),
    ({"type": "none"}, "none", None),
])
def test_tool_choice(choice, typed, parallel):
    request = parse_messages_body(body(tools=[TOOL], tool_choice=choice), None).generation
    assert (request.tool_choice, request.parallel_tool_calls) == (typed, parallel)


def test_top_k_is_carried_and_zero_is_none():
    assert parse_messages_body(body(top_k=3), None).generation.top_k == 3
    assert parse_messages_body(body(top_k=0), None).generation.top_k is None


@pytest.mark.parametrize(("thinking", "mode", "effort"), [
    ({"type": "enabled", "budget_tokens": 2048}, "enabled", None),
    ({"type": "disabled"}, None, "none"),
    ({"type": "adaptive"}, None, "medium"),
])
def test_thinking(thinking, mode, effort):
    request = parse_messages_body(body(thinking=thinking), None).generation
    assert (request.thinking, request.reasoning_effort) == (mode, effort)


@pytest.mark.parametrize(("fields", "param"), [
    ({"max_tokens": None}, "max_tokens"),
    ({"top_k": -1}, "top_k"),
    ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "other"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"tools": [TOOL, TOOL]}, "tools[1].name"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x"}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": []}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}]}]}, "messages[0].content[0].content"),
    ({"temperature": 1.5}, "temperature"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "x"}}]}]},
     "messages[0].content[0].source.data"),
    ({"system": [{"type": "text", "text": 3}]}, "system[0].text"),
])
def test_refusals_name_the_field(fields, param):
    data = {key: value for key, value in body(**fields).items() if value is not None}
    with pytest.raises(InvalidRequest) as caught:
        parse_messages_body(data, None)
    assert caught.value.param == param


def test_count_tokens_takes_the_body_without_max_tokens():
    data = body()
    del data["max_tokens"]
    assert parse_count_tokens_body(data, None).generation.max_output_tokens is None
    with pytest.raises(InvalidRequest):
        parse_messages_body(data, None)


def test_metadata_user_id_is_no_fairness_key_by_default():
    assert parse_messages_body(body(metadata={"user_id": "session-1"}), None).generation.fairness_key is None


def test_metadata_user_id_is_the_fairness_key_where_the_operator_lets_it(metadata_fairness):
    assert parse_messages_body(body(metadata={"user_id": "session-1"}), None).generation.fairness_key == "session-1"
    # An API key's bucket (or a fairness header) decides first.
    assert parse_messages_body(body(metadata={"user_id": "session-1"}), "team-a").generation.fairness_key == "team-a"
    with pytest.raises(FairnessKeyTooLong) as caught:
        parse_messages_body(body(metadata={"user_id": "x" * 257}), None)
    assert caught.value.param == "metadata.user_id"
