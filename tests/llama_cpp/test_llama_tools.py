"""Tool calling on llama_cpp, SmolLM2 for real in its engine process (the mechanics, not the
words): with tool_choice "required" or a named function a grammar from the tools' JSON schemas
constrains the answer, so it is a call whose arguments parse and match the schema; "auto" runs
and answers text or valid calls; a two-turn history with the call and its result renders and
runs; the openai client on both APIs over HTTP, every answer validated strictly.  The
definition's tool_call_format (auto from the template, explicit, none) and the
grammar's refusal of a schema it cannot convert, without a model."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from llama_helpers import SMOLLM2_MODEL, load as load_over_http, start_service
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response

from runtime.backends import BACKENDS
from runtime.backends.llama_cpp.engine import LlamaCppEngine
from runtime.errors import InvalidRequest, ToolsUnsupported
from runtime.inputs.prompt_formats import GgufChatTemplate
from tests.engine_process.conftest import no_engine_process_left, state_dir  # noqa: F401 - fixtures
from tests.engines.runtime_driver import generation_request, load

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather forecast for a city",
                                      "parameters": WEATHER_PARAMETERS}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone",
                                      "parameters": {"type": "object", "properties": {"zone": {"type": "string",
                                                                                               "maxLength": 10}},
                                                     "required": ["zone"]}}},
]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
PROMPT = "What will the weather be in Paris for the next 3 days?"
GREEDY = {"temperature": 0.0, "max_output_tokens": 96}


def user(text: str = PROMPT) -> list[dict]:
    return [{"role": "user", "content": [{"type": "input_text", "text": text}]}]


async def generate(service, messages, **fields) -> tuple[dict, list[dict]]:
    """(result, streamed events) of one generate operation on "smol"."""
    events: list[dict] = []

    async def emit(event: dict) -> None:
        events.append(event)

    payload = {"request_id": f"tools-{len(events)}-{id(fields)}", "model": "smol", "messages": messages, **fields}
    return await service.handle("generate", payload, emit), events


def assert_valid_calls(calls: list[dict]) -> None:
    for call in calls:
        assert call["name"] in SCHEMAS and call["id"].startswith("call_")
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


async def test_required_is_a_grammar_constrained_call_whose_arguments_match_the_schema(runtime_service):
    service, _ = await runtime_service({"smol": SMOLLM2_MODEL})
    await load(service, "smol")
    result, _ = await generate(service, user(), tools=TOOLS, tool_choice="required", **GREEDY)
    assert result["finish_reason"] == "tool_calls" and result["text"] == ""
    assert len(result["tool_calls"]) == 1
    assert_valid_calls(result["tool_calls"])
    streamed, events = await generate(service, user(), tools=TOOLS, tool_choice="required", stream=True, **GREEDY)
    calls = [event for event in events if event["event"] == "tool_call"]
    assert [event["index"] for event in calls] == [0]
    assert [event["call"]["arguments"] for event in calls] == [call["arguments"] for call in streamed["tool_calls"]]
    assert streamed["tool_calls"][0]["arguments"] == result["tool_calls"][0]["arguments"]  # greedy: the same call
    assert not [event for event in events if event["event"] == "delta" and event["text"]]  # the JSON is no text


async def test_a_named_function_and_parallel_calls_keep_to_the_grammar(runtime_service):
    service, _ = await runtime_service({"smol": SMOLLM2_MODEL})
    await load(service, "smol")
    named = {"type": "function", "function": {"name": "get_time"}}
    result, _ = await generate(service, user(), tools=TOOLS, tool_choice=named, **GREEDY)
    assert result["finish_reason"] == "tool_calls"
    assert [call["name"] for call in result["tool_calls"]] == ["get_time"]
    assert_valid_calls(result["tool_calls"])
    parallel, _ = await generate(service, user(), tools=TOOLS, tool_choice="required", parallel_tool_calls=True,
                                 **{**GREEDY, "max_output_tokens": 160})
    if parallel["finish_reason"] == "tool_calls":  # a list of calls, closed within the budget
        assert len(parallel["tool_calls"]) >= 1
        assert_valid_calls(parallel["tool_calls"])
    else:  # cut at max_output_tokens: the unfinished list is text, never a broken call
        assert parallel["finish_reason"] == "length" and "tool_calls" not in parallel


async def test_auto_answers_text_or_valid_calls_and_a_tool_result_turn_runs(runtime_service):
    service, _ = await runtime_service({"smol": SMOLLM2_MODEL})
    await load(service, "smol")
    result, _ = await generate(service, user(), tools=TOOLS, **GREEDY)
    if "tool_calls" in result:
        assert result["finish_reason"] == "tool_calls"
        assert_valid_calls(result["tool_calls"])
    else:
        assert result["finish_reason"] in ("stop", "length") and "<tool_call>" not in result["text"]
    call = {"id": "call_1", "name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 3})}
    history = user() + [
        {"role": "assistant", "content": [], "tool_calls": [call]},
        {"role": "tool", "content": [{"type": "input_text", "text": "Sunny, 21 degrees"}], "tool_call_id": "call_1"},
    ]
    answer, _ = await generate(service, history, tools=TOOLS, **{**GREEDY, "max_output_tokens": 32})
    assert answer["usage"]["input_tokens"] > result["usage"]["input_tokens"]  # the call and its result are in the prompt
    assert answer["finish_reason"] in ("stop", "length", "tool_calls")
    if "tool_calls" in answer:
        assert_valid_calls(answer["tool_calls"])
    else:
        assert answer["text"].strip()


async def test_tool_choice_none_is_plain_generation(runtime_service):
    service, _ = await runtime_service({"smol": SMOLLM2_MODEL})
    await load(service, "smol")
    plain, _ = await generate(service, user(), **GREEDY)
    ignored, _ = await generate(service, user(), tools=TOOLS, tool_choice="none", **GREEDY)
    assert ignored["text"] == plain["text"] and "tool_calls" not in ignored  # the tools are not even rendered


def test_the_openai_client_gets_a_constrained_call_from_smollm2_on_both_apis(tmp_path):
    live = start_service(tmp_path, {"smol": SMOLLM2_MODEL})
    try:
        with live.client(timeout=120) as http:
            assert load_over_http(http, "smol")["runtime_state"] == "loaded"
        with openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
            fields = {"model": "smol", "messages": [{"role": "user", "content": PROMPT}], "tools": TOOLS,
                      "tool_choice": "required", "temperature": 0, "max_tokens": 96}
            answer = client.chat.completions.create(**fields)
            ChatCompletion.model_validate(answer.model_dump(exclude_unset=True), strict=True)
            assert answer.choices[0].finish_reason == "tool_calls" and answer.choices[0].message.content is None
            calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                     for c in answer.choices[0].message.tool_calls]
            assert_valid_calls(calls)
            chunks = list(client.chat.completions.create(**fields, stream=True))
            for chunk in chunks:
                ChatCompletionChunk.model_validate(chunk.model_dump(exclude_unset=True), strict=True)
            pieces = [p for c in chunks if c.choices for p in c.choices[0].delta.tool_calls or ()]
            assert pieces[0].function.name == calls[0]["name"]
            assert "".join(p.function.arguments or "" for p in pieces) == calls[0]["arguments"]  # greedy: alike
            assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            responses_tools = [{"type": "function", **tool["function"]} for tool in TOOLS]
            response = client.responses.create(model="smol", input=PROMPT, tools=responses_tools, temperature=0,
                                               tool_choice={"type": "function", "name": "get_weather"},
                                               max_output_tokens=96)
            Response.model_validate(response.model_dump(exclude_unset=True), strict=True)
            (item,) = response.output
            assert item.type == "function_call" and item.name == "get_weather"
            assert_valid_calls([{"id": item.call_id, "name": item.name, "arguments": item.arguments}])
    finally:
        live.stop()


def definition(**fields):
    return BACKENDS["llama_cpp"].definition_model.model_validate({**SMOLLM2_MODEL, **fields})


def test_capabilities_follow_tool_call_format_and_the_prompt_format():
    spec = BACKENDS["llama_cpp"]
    assert spec.capabilities(definition())["tools"] is True
    assert spec.capabilities(definition())["tool_choice"] == ["none", "auto", "required", "function"]
    assert spec.capabilities(definition(tool_call_format="none"))["tools"] is False
    assert spec.capabilities(definition(prompt_format="translategemma_template"))["tools"] is False
    with pytest.raises(ValueError):
        definition(tool_call_format="xml")


async def test_a_model_with_tool_call_format_none_refuses_tools(runtime_service):
    service, _ = await runtime_service({"smol": {**SMOLLM2_MODEL, "tool_call_format": "none"}})
    with pytest.raises(ToolsUnsupported) as refused:
        await generate(service, user(), tools=TOOLS, **GREEDY)
    assert refused.value.param == "tools"


LLAMA3_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}<|python_tag|>{% endif %}"


def engine(template: str | None = None, **config) -> LlamaCppEngine:
    """An engine that is not loaded, with the template it would have read from its GGUF."""
    made = LlamaCppEngine("m", {**definition().model_dump(), **config}, 0, {})
    if template is not None:
        made.gguf_template = GgufChatTemplate(template, "<s>", "</s>")
    made._tool_call_formats = made._resolve_tool_call_formats()
    return made


def test_tool_call_format_auto_reads_the_template_and_a_grammar_answers_json():
    request = generation_request(tools=TOOLS)
    assert engine(LLAMA3_TEMPLATE).tool_call_format(request) == "llama3_json"
    assert engine("{{ messages[0].content }}").tool_call_format(request) == "hermes"  # tools described as hermes text
    assert engine(LLAMA3_TEMPLATE, tool_call_format="mistral").tool_call_format(request) == "mistral"
    assert engine(LLAMA3_TEMPLATE, tool_call_format="none").tool_call_format(request) is None
    required = generation_request(tools=TOOLS, tool_choice="required")
    assert engine(LLAMA3_TEMPLATE).tool_call_format(required) == "json"
    assert engine(LLAMA3_TEMPLATE).tool_call_formats() == {"auto": "llama3_json", "required": "json", "function": "json"}


def test_the_grammar_is_built_only_for_required_or_named_and_refuses_what_it_cannot_convert():
    made = engine("{{ messages[0].content }}")
    assert made.grammar(generation_request(tools=TOOLS)) is None
    assert made.grammar(generation_request(tools=TOOLS, tool_choice="none")) is None
    grammar = made.grammar(generation_request(tools=TOOLS, tool_choice="required"))
    assert "root ::=" in grammar and '\\"get_weather\\"' in grammar and '\\"get_time\\"' in grammar
    named = made.grammar(generation_request(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}}))
    assert '\\"get_time\\"' in named and "get_weather" not in named
    unconvertible = [{"type": "function", "function": {"name": "f", "parameters": {"type": "frobnicate"}}}]
    with pytest.raises(InvalidRequest) as refused:
        made.grammar(generation_request(tools=unconvertible, tool_choice="required"))
    assert refused.value.param == "tools"
