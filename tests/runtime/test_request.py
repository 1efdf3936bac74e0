"""The one typed request: the parser leaves unset sampling to the runtime, which resolves it."""
from models_app.api.responses.protocol import parse_responses_body
from runtime.request import DecodingSettings, GenerationRequest

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
