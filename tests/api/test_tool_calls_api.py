"""Tool calling on both APIs against a live service, on stub models whose calls are scripted
(``stub_tool_calls``: written in the hermes format over several deltas, read by the runtime's
parser): the exact answers, streamed and not, every chat completion / chunk and every Responses
event validated strictly with the openai package's own types; no markup in the text; a broken
call given back as text; parallel_tool_calls, named and "none" choices; the refusals
(tools_unsupported, shapes 400 naming the field); a two-turn exchange with the openai client;
the same through an engine process (the formats cross in the loaded frame)."""
from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.conftest import model_entry, openai_client, service_with_loaded_models

WEATHER = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
CLOCK = {"name": "get_time", "arguments": {"zone": "CET"}}
PREAMBLE = "Let me check that."
BROKEN_ARGUMENTS = '{"city": Paris'
MODELS = {
    "tooler": {"backend": "stub", "stub_tool_calls": [WEATHER]},
    "pair": {"backend": "stub", "stub_tool_calls": [WEATHER, CLOCK], "stub_tool_preamble": PREAMBLE},
    "broken": {"backend": "stub", "stub_tool_calls": [{"name": "get_weather", "arguments": BROKEN_ARGUMENTS}]},
    "auto_only": {"backend": "stub", "stub_tool_calls": [WEATHER], "tool_choice": ["none", "auto"]},
    "plain": {"backend": "stub", "stub_reply": "no tools here"},
    "isolated": {"backend": "stub", "stub_tool_calls": [WEATHER, CLOCK], "isolation": "process"},
}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                       "required": ["city"]},
    }},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
RESPONSES_TOOLS = [{"type": "function", **tool["function"]} for tool in TOOLS]
WEATHER_ARGUMENTS = json.dumps(WEATHER["arguments"])
CLOCK_ARGUMENTS = json.dumps(CLOCK["arguments"])
STREAM_EVENT = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    with service_with_loaded_models(tmp_path_factory.mktemp("tool_calls_api"), MODELS, unloaded=()) as live:
        yield live


@pytest.fixture
def client(service):
    with openai_client(service) as client:
        yield client


def chat_body(model="tooler", content="weather in Paris?", **fields) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], "tools": TOOLS, **fields}


def completion(answer) -> ChatCompletion:
    assert answer.status_code == 200, answer.text
    return ChatCompletion.model_validate(answer.json(), strict=True)


def chunks(http, body: dict) -> list[ChatCompletionChunk]:
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as answer:
        assert answer.status_code == 200, answer.read()
        lines = [line for line in answer.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [ChatCompletionChunk.model_validate(json.loads(line[6:]), strict=True) for line in lines[:-1]]


def assert_error(answer, status: int, code: str, param: str | None) -> None:
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error


def calls_of(message) -> list[tuple[str, str]]:
    return [(call.function.name, call.function.arguments) for call in message.tool_calls or ()]


# ---- chat completions ----------------------------------------------------------------------


@pytest.mark.parametrize("model", ["tooler", "isolated"])
def test_chat_answers_the_call_as_message_tool_calls(http, model):
    answer = completion(http.post("/v1/chat/completions", json=chat_body(model)))
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_") and len(call.id) > 8
    assert calls_of(choice.message)[0] == ("get_weather", WEATHER_ARGUMENTS)
    raw = http.post("/v1/chat/completions", json=chat_body(model)).json()["choices"][0]["message"]
    assert set(raw) == {"role", "content", "refusal", "tool_calls"} and raw["content"] is None


def test_chat_streams_each_call_as_openai_does(http):
    streamed = chunks(http, chat_body("pair", stream_options={"include_usage": True}))
    deltas = [chunk.choices[0].delta for chunk in streamed if chunk.choices]
    content = [delta.content for delta in deltas if delta.content]
    assert "".join(content) == PREAMBLE and not any("<" in piece or "tool" in piece for piece in content)
    pieces = [call for delta in deltas for call in delta.tool_calls or ()]
    first, second = pieces[0], pieces[2]
    assert [piece.index for piece in pieces] == [0, 0, 1, 1]
    assert (first.type, first.function.name, first.function.arguments) == ("function", "get_weather", "")
    assert first.id.startswith("call_") and pieces[1].id is None and pieces[1].function.name is None
    assert pieces[1].function.arguments == WEATHER_ARGUMENTS
    assert (second.function.name, pieces[3].function.arguments) == ("get_time", CLOCK_ARGUMENTS)
    assert second.id != first.id
    reasons = [chunk.choices[0].finish_reason for chunk in streamed if chunk.choices and chunk.choices[0].finish_reason]
    assert reasons == ["tool_calls"]
    assert streamed[-1].usage is not None and not streamed[-1].choices
    raw_first = next(c for c in streamed if c.choices and c.choices[0].delta.tool_calls).model_dump(exclude_unset=True)
    assert raw_first["choices"][0]["delta"] == {"tool_calls": [{
        "index": 0, "id": first.id, "type": "function", "function": {"name": "get_weather", "arguments": ""},
    }]}


def test_chat_text_and_calls_together_and_parallel_tool_calls_false(http):
    both = completion(http.post("/v1/chat/completions", json=chat_body("pair"))).choices[0]
    assert both.message.content == PREAMBLE
    assert calls_of(both.message) == [("get_weather", WEATHER_ARGUMENTS), ("get_time", CLOCK_ARGUMENTS)]
    one = completion(http.post("/v1/chat/completions", json=chat_body("pair", parallel_tool_calls=False))).choices[0]
    assert calls_of(one.message) == [("get_weather", WEATHER_ARGUMENTS)] and one.finish_reason == "tool_calls"
    streamed = chunks(http, chat_body("pair", parallel_tool_calls=False))
    assert [p.index for c in streamed if c.choices for p in c.choices[0].delta.tool_calls or ()] == [0, 0]


def test_chat_named_and_required_choices(http):
    named = {"type": "function", "function": {"name": "get_time"}}
    answer = completion(http.post("/v1/chat/completions", json=chat_body("pair", tool_choice=named))).choices[0]
    assert calls_of(answer.message) == [("get_time", CLOCK_ARGUMENTS)]
    required = completion(http.post("/v1/chat/completions", json=chat_body("tooler", tool_choice="required")))
    assert calls_of(required.choices[0].message) == [("get_weather", WEATHER_ARGUMENTS)]


def test_chat_tool_choice_none_answers_text(http):
    answer = completion(http.post("/v1/chat/completions", json=chat_body("tooler", tool_choice="none")))
    assert (answer.choices[0].message.content, answer.choices[0].finish_reason) == ("weather in Paris?", "stop")
    assert answer.choices[0].message.tool_calls is None


def test_a_broken_call_is_given_back_as_text_with_stop(http):
    answer = completion(http.post("/v1/chat/completions", json=chat_body("broken"))).choices[0]
    assert answer.finish_reason == "stop" and answer.message.tool_calls is None
    assert answer.message.content == (
        '<tool_call>\n{"name": "get_weather", "arguments": ' + BROKEN_ARGUMENTS + "}\n</tool_call>"
    )
    streamed = chunks(http, chat_body("broken"))
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == answer.message.content
    assert not any(c.choices[0].delta.tool_calls for c in streamed if c.choices)


def test_the_openai_client_two_turn_exchange(client):
    messages = [{"role": "user", "content": "weather in Paris?"}]
    first = client.chat.completions.create(model="tooler", messages=messages, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    assert (first.choices[0].finish_reason, call.function.name) == ("tool_calls", "get_weather")
    assert json.loads(call.function.arguments) == WEATHER["arguments"]
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}]
    second = client.chat.completions.create(model="tooler", messages=messages, tools=TOOLS)
    assert (second.choices[0].message.content, second.choices[0].finish_reason) == ("18 degrees and sunny", "stop")
    with client.chat.completions.stream(model="tooler", messages=messages[:1], tools=TOOLS) as stream:
        final = stream.get_final_completion()
    assert calls_of(final.choices[0].message) == [("get_weather", WEATHER_ARGUMENTS)]


@pytest.mark.parametrize(
    ("model", "fields", "code", "param"),
    [
        ("plain", {}, "tools_unsupported", "tools"),
        ("auto_only", {"tool_choice": "required"}, "tools_unsupported", "tool_choice"),
        ("auto_only", {"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tools_unsupported",
         "tool_choice"),
        ("tooler", {"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "invalid_request", "tool_choice"),
        ("tooler", {"tool_choice": "sometimes"}, "invalid_request", "tool_choice"),
        ("tooler", {"tool_choice": {"type": "function", "name": "get_time"}}, "invalid_request", "tool_choice"),
        ("tooler", {"tools": [{"type": "function", "function": {"description": "x"}}]}, "invalid_request",
         "tools[0].function.name"),
        ("tooler", {"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "invalid_request", "tools[0].type"),
        ("tooler", {"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "invalid_request",
         "tools[0].function.name"),
        ("tooler", {"tools": [TOOLS[0], TOOLS[0]]}, "invalid_request", "tools[1].function.name"),
        ("tooler", {"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "invalid_request",
         "tools[0].function.parameters"),
    ],
)
def test_tool_refusals_name_the_field(http, model, fields, code, param):
    assert_error(http.post("/v1/chat/completions", json=chat_body(model, **fields)), 400, code, param)


def test_plain_model_takes_tools_with_choice_none(http):
    answer = completion(http.post("/v1/chat/completions", json=chat_body("plain", tool_choice="none")))
    assert answer.choices[0].message.content == "no tools here"


def history(result_message: dict | None = None) -> list[dict]:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": WEATHER_ARGUMENTS}}
    return [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        result_message or {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "rainy"}]},
    ]


def test_tool_messages_in_the_history(http):
    answer = completion(http.post("/v1/chat/completions", json={"model": "tooler", "messages": history(), "tools": TOOLS}))
    assert (answer.choices[0].message.content, answer.choices[0].finish_reason) == ("rainy", "stop")
    refused = http.post("/v1/chat/completions", json={"model": "plain", "messages": history()})
    assert_error(refused, 400, "tools_unsupported", "messages[1]")
    no_id = http.post("/v1/chat/completions", json={"model": "tooler", "messages": history(
        {"role": "tool", "content": "rainy"})})
    assert_error(no_id, 400, "invalid_request", "messages[2].tool_call_id")
    bad_call = history()
    bad_call[1]["tool_calls"][0].pop("function")
    assert_error(http.post("/v1/chat/completions", json={"model": "tooler", "messages": bad_call}), 400,
                 "invalid_request", "messages[1].tool_calls[0].function")
    legacy = http.post("/v1/chat/completions", json={"model": "tooler", "messages": [
        {"role": "user", "content": "x"}, {"role": "function", "name": "f", "content": "1"}]})
    assert_error(legacy, 400, "tools_unsupported", "messages[1]")


def test_capabilities_say_tools_and_the_choices_honoured(http):
    assert (model_entry(http, "tooler")["capabilities"]["tools"],
            model_entry(http, "tooler")["capabilities"]["tool_choice"]) == (True, ["none", "auto", "required", "function"])
    assert model_entry(http, "auto_only")["capabilities"]["tool_choice"] == ["none", "auto"]
    plain = model_entry(http, "plain")["capabilities"]
    assert (plain["tools"], plain["tool_choice"]) == (False, ["none"])


# ---- responses ---------------------------------------------------------------------------


def responses_body(model="tooler", **fields) -> dict:
    return {"model": model, "input": "weather in Paris?", "tools": RESPONSES_TOOLS, **fields}


def response_of(answer) -> Response:
    assert answer.status_code == 200, answer.text
    return Response.model_validate(answer.json(), strict=True)


def events_of(http, body: dict) -> list[dict]:
    with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as answer:
        assert answer.status_code == 200, answer.read()
        events = [json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: ")]
    for event in events:
        STREAM_EVENT.validate_python(event, strict=True)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    return events


@pytest.mark.parametrize("model", ["tooler", "isolated"])
def test_responses_answers_function_call_items(http, model):
    answer = http.post("/v1/responses", json=responses_body(model, parallel_tool_calls=False))
    response = response_of(answer)
    (item,) = answer.json()["output"]
    assert item == {"type": "function_call", "id": item["id"], "call_id": item["call_id"], "name": "get_weather",
                    "arguments": WEATHER_ARGUMENTS, "status": "completed"}
    assert item["id"].startswith("fc_") and item["call_id"].startswith("call_")
    assert response.status == "completed"
    assert [tool.name for tool in response.tools] == ["get_weather", "get_time"]
    assert response.tools[0].parameters == TOOLS[0]["function"]["parameters"]
    assert (response.tool_choice, response.parallel_tool_calls) == ("auto", False)


def test_responses_streams_the_message_then_each_call(http):
    events = events_of(http, responses_body("pair"))
    assert [event["type"] for event in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        *["response.output_text.delta"] * 4,
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        *["response.output_item.added", "response.function_call_arguments.delta",
          "response.function_call_arguments.done", "response.output_item.done"] * 2,
        "response.completed",
    ]
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == PREAMBLE
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [(e["output_index"], e["item"]["type"]) for e in added] == [(0, "message"), (1, "function_call"),
                                                                        (2, "function_call")]
    assert added[1]["item"]["arguments"] == "" and added[1]["item"]["status"] == "in_progress"
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [(e["name"], e["arguments"], e["output_index"]) for e in done] == [
        ("get_weather", WEATHER_ARGUMENTS, 1), ("get_time", CLOCK_ARGUMENTS, 2)]
    deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert [e["item_id"] for e in deltas] == [added[1]["item"]["id"], added[2]["item"]["id"]]
    final = Response.model_validate(events[-1]["response"], strict=True)
    assert [item.type for item in final.output] == ["message", "function_call", "function_call"]
    assert final.output[0].content[0].text == PREAMBLE
    assert [(item.name, item.arguments) for item in final.output[1:]] == [
        ("get_weather", WEATHER_ARGUMENTS), ("get_time", CLOCK_ARGUMENTS)]
    non_streamed = http.post("/v1/responses", json=responses_body("pair")).json()
    assert [item["type"] for item in non_streamed["output"]] == ["message", "function_call", "function_call"]


def test_responses_streams_a_call_only_answer_without_a_message(http):
    events = events_of(http, responses_body("tooler", tool_choice={"type": "function", "name": "get_weather"}))
    assert [event["type"] for event in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed",
    ]
    final = Response.model_validate(events[-1]["response"], strict=True)
    assert final.tool_choice.name == "get_weather" and [item.type for item in final.output] == ["function_call"]


def test_responses_two_turn_exchange_with_the_openai_client(client):
    first = client.responses.create(model="tooler", input="weather in Paris?", tools=RESPONSES_TOOLS)
    (call,) = first.output
    assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "get_weather", WEATHER["arguments"])
    follow_up = [{"role": "user", "content": "weather in Paris?"}, call.model_dump(exclude_none=True),
                 {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees"}]
    second = client.responses.create(model="tooler", input=follow_up, tools=RESPONSES_TOOLS)
    assert second.output_text == "18 degrees"
    with client.responses.stream(model="tooler", input="weather?", tools=RESPONSES_TOOLS) as stream:
        final = stream.get_final_response()
    assert [(item.type, item.name) for item in final.output] == [("function_call", "get_weather")]


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"model": "plain"}, "tools_unsupported", "tools"),
        ({"model": "auto_only", "tool_choice": "required"}, "tools_unsupported", "tool_choice"),
        ({"tool_choice": {"type": "function", "name": "nope"}}, "invalid_request", "tool_choice"),
        ({"tool_choice": {"type": "file_search"}}, "invalid_request", "tool_choice"),
        ({"tools": [{"type": "web_search"}]}, "invalid_request", "tools[0].type"),
        ({"tools": [{"type": "function"}]}, "invalid_request", "tools[0].name"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "invalid_request", "input[0].call_id"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "invalid_request", "input[0].arguments"),
    ],
)
def test_responses_tool_refusals_name_the_field(http, fields, code, param):
    assert_error(http.post("/v1/responses", json={**responses_body(), **fields}), 400, code, param)
