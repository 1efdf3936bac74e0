"""The two kinds of request: the typed one (the parser leaves unset sampling to the runtime, which resolves
it) and the forwarded one (a client's body), their wire forms, and which kind an engine gets."""
import dataclasses

import msgpack
import pytest

from models_app.api.chat.protocol import parse_chat_body
from models_app.api.responses.protocol import parse_responses_body
from runtime.backends import BACKENDS
from runtime.errors import InvalidRequest
from runtime.inference.admission import check_request
from runtime.inputs.request import DecodingSettings, ForwardedRequest, GenerationRequest, request_from_wire
from runtime.pool.catalog import CatalogEntry

MESSAGES = [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]


def test_the_responses_parser_builds_the_typed_request_with_unset_sampling_left_none():
    request = parse_responses_body({"model": "m", "input": "hi", "top_p": 0.5, "user": "u"}, None)
    assert isinstance(request, GenerationRequest)
    assert (request.model, request.messages, request.fairness_key) == ("m", MESSAGES, "u")
    assert (request.max_output_tokens, request.temperature, request.top_p, request.thinking) == (None, None, 0.5, None)


def test_resolved_applies_the_service_decoding_only_where_unset():
    decoding = DecodingSettings(temperature=0.2, top_p=0.9, max_output_tokens=64)
    request = GenerationRequest("r", MESSAGES, top_p=0.5).resolved(decoding)
    assert (request.max_output_tokens, request.temperature, request.top_p, request.thinking) == (64, 0.2, 0.5, "default")
    assert GenerationRequest("r", MESSAGES).resolved().max_output_tokens == DecodingSettings().max_output_tokens


def test_the_wire_form_round_trips_and_drops_keys_it_does_not_know():
    request = GenerationRequest("r", MESSAGES, model="m", stop=["\n"], seed=7, tools=[{"type": "function"}])
    wire = request.to_wire()
    assert GenerationRequest.from_wire(wire) == request
    assert GenerationRequest.from_wire({**wire, "from_a_newer_api": 1}) == request


CHAT_BODY = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "be brief", "name": "ops"},
        {"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA", "detail": "low"}},
            {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": None}},
            {"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}},
            {"type": "file", "file": {"file_data": "AA", "filename": "a.pdf", "other": 1}},
        ]},
        {"role": "assistant", "content": None, "reasoning_content": "hm",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "42"}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
        {"role": "function", "name": "f", "content": "old"},
        {"role": "user", "content": "go on"},
    ],
}

TYPED_CHAT_MESSAGES = [
    {"role": "system", "content": [{"type": "input_text", "text": "be brief"}]},
    {"role": "user", "content": [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "low"},
        {"type": "input_image", "image_url": "https://x/y.png"},
        {"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}},
        {"type": "input_file", "file_data": "AA", "filename": "a.pdf"},
    ]},
    {"role": "assistant", "content": [], "tool_calls": [{"id": "c1", "name": "f", "arguments": "{}"}]},
    {"role": "tool", "content": [{"type": "input_text", "text": "42"}], "tool_call_id": "c1"},
    {"role": "assistant", "content": [{"type": "input_text", "text": "no"}]},
    {"role": "function", "content": [{"type": "input_text", "text": "old"}]},
    {"role": "user", "content": [{"type": "input_text", "text": "go on"}]},
]


def test_the_chat_parser_builds_the_typed_messages_of_every_part_and_message_kind():
    request = parse_chat_body(CHAT_BODY, None).forwarded
    assert request.typed.messages == TYPED_CHAT_MESSAGES
    assert [error["param"] for error in request.typed_refusals] == ["messages[5]"]  # the legacy function message


def test_a_chat_request_crosses_the_wire_with_its_conversation_once_and_comes_back_whole():
    request = parse_chat_body(CHAT_BODY, None).forwarded
    wire = request.to_wire()
    assert "messages" not in wire and wire["passthrough"]["body"] is CHAT_BODY
    assert request_from_wire(msgpack.unpackb(msgpack.packb(wire))) == request
    long_text = "x" * 100_000
    long_request = parse_chat_body({"model": "m", "messages": [{"role": "user", "content": long_text}]}, None)
    packed = msgpack.packb(long_request.forwarded.to_wire())
    assert len(long_text) < len(packed) < len(long_text) + 2_000
    assert request_from_wire(msgpack.unpackb(packed)).typed.messages[0]["content"][0]["text"] == long_text


def test_a_request_whose_messages_are_its_own_keeps_them_on_the_wire():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    request = ForwardedRequest(GenerationRequest("r", MESSAGES), "/v1/chat/completions", body)
    assert request.to_wire()["messages"] == MESSAGES
    assert request_from_wire(request.to_wire()) == request


def test_the_runtime_hands_a_forwarding_engine_the_body_and_any_other_the_typed_request():
    forwarded = ForwardedRequest(GenerationRequest("r", MESSAGES).resolved(), "/v1/chat/completions",
                                 {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2},
                                 typed_refusals=[InvalidRequest("n must be 1", param="n").to_dict()])
    assert check_request(catalog_entry("openai_remote"), forwarded, allow_remote=True) is forwarded
    with pytest.raises(InvalidRequest) as refused:  # the typed request cannot honour n
        check_request(catalog_entry("stub"), forwarded, allow_remote=True)
    assert refused.value.param == "n"
    honourable = dataclasses.replace(forwarded, typed_refusals=[])
    assert check_request(catalog_entry("stub"), honourable, allow_remote=True) is honourable.typed
    assert check_request(catalog_entry("openai_remote"), forwarded.typed, allow_remote=True) is forwarded.typed


def catalog_entry(backend: str) -> CatalogEntry:
    remote = {"remote_base_url": "https://api.example.com/v1", "remote_model": "x"}
    fields = remote if backend == "openai_remote" else {}
    definition = BACKENDS[backend].definition_model.model_validate({"backend": backend, **fields})
    return CatalogEntry(name="m", definition=definition, sources=("settings.json",), base_dir="/")
