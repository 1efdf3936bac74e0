"""The tool-call formats of open model families, parsed as the text arrives (runtime/inference/tool_calls.py)."""
import json

import pytest

from runtime.inference.tool_calls import ToolCallParser, constrained_schema, detect_format

WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
NAMES = ["get_weather", "get_time"]


def run(fmt: str, pieces: list[str]):
    parser = ToolCallParser(fmt, NAMES)
    texts, calls = [], []
    for piece in pieces:
        text, done = parser.feed(piece)
        texts.append(text)
        calls.extend(done)
    text, done = parser.finish()
    texts.append(text)
    calls.extend(done)
    return texts, calls


def chars(text: str) -> list[str]:
    return list(text)


def test_hermes_call_after_text_never_leaks_markup_one_character_at_a_time():
    answer = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    texts, calls = run("hermes", chars(answer))
    assert "".join(texts) == "Let me check."
    assert all("<" not in text for text in texts)
    assert [(call.name, json.loads(call.arguments)) for call in calls] == [("get_weather", {"city": "Oslo"})]
    assert calls[0].id.startswith("call_") and len(calls[0].id) == 29


def test_hermes_parallel_calls_and_whitespace_between_them():
    answer = (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\n'
    )
    texts, calls = run("hermes", [answer[:30], answer[30:70], answer[70:]])
    assert "".join(texts) == ""
    assert [call.name for call in calls] == ["get_weather", "get_time"]
    assert len({call.id for call in calls}) == 2


@pytest.mark.parametrize("block", [
    '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>',  # arguments that do not parse
    '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',  # a tool nobody offered
    '<tool_call>{"name": "get_weather", "arguments": [1, 2]}</tool_call>',  # arguments not an object
])
def test_hermes_broken_call_is_given_back_as_text(block):
    texts, calls = run("hermes", chars(block))
    assert calls == []
    assert "".join(texts) == block


def test_hermes_plain_text_with_a_lone_angle_bracket_passes():
    texts, calls = run("hermes", ["a < b and <tool", "s> are fine"])
    assert "".join(texts) == "a < b and <tools> are fine" and calls == []
    # "<tool" may begin a call: held back until it is known, with the space before it (a call's)
    assert texts[0] == "a < b and"


def test_hermes_unclosed_block_at_the_end_is_a_call_when_it_parses():
    texts, calls = run("hermes", ['<tool_call>{"name": "get_time", "arguments": {}}'])
    assert [call.name for call in calls] == ["get_time"] and "".join(texts) == ""


def test_hermes_arguments_written_as_a_json_string_are_an_object():
    texts, calls = run("hermes", ['<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}</tool_call>'])
    assert json.loads(calls[0].arguments) == {"city": "Rome"}


def test_llama3_json_whole_answer_with_python_tag_and_parameters():
    answer = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Lima"}}'
    texts, calls = run("llama3_json", chars(answer))
    assert "".join(texts) == ""
    assert [(call.name, json.loads(call.arguments)) for call in calls] == [("get_weather", {"city": "Lima"})]


def test_llama3_json_semicolon_separated_calls():
    answer = '{"name": "get_weather", "parameters": {"city": "Lima"}}; {"name": "get_time", "parameters": {}}'
    _, calls = run("llama3_json", [answer])
    assert [call.name for call in calls] == ["get_weather", "get_time"]


def test_llama3_json_text_answer_streams_at_once():
    texts, calls = run("llama3_json", ["The weather", " is fine."])
    assert texts[:2] == ["The weather", " is fine."] and calls == []


def test_llama3_json_answer_that_looks_like_json_but_is_no_call_is_text():
    texts, calls = run("llama3_json", ['{"answer": 42}'])
    assert "".join(texts) == '{"answer": 42}' and calls == []


def test_mistral_list_of_calls():
    answer = '[TOOL_CALLS][{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Nice"}}]'
    texts, calls = run("mistral", chars(answer))
    assert "".join(texts) == "" and [call.name for call in calls] == ["get_time", "get_weather"]


def test_json_format_is_what_a_constrained_answer_is():
    _, calls = run("json", ['[{"name": "get_time", "arguments": {}}]'])
    assert [call.name for call in calls] == ["get_time"]
    _, calls = run("json", ['{"name": "get_weather", "arguments": {"city": "Bern"}}'])
    assert json.loads(calls[0].arguments) == {"city": "Bern"}


def test_empty_answer_is_empty_text():
    for fmt in ("hermes", "llama3_json", "mistral", "json"):
        texts, calls = run(fmt, ["", "  "])
        assert "".join(texts) == "  " and calls == []


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="unknown tool-call format 'xml'"):
        ToolCallParser("xml", NAMES)


@pytest.mark.parametrize(("template", "expected"), [
    ("{% if tools %}<tools>{{ tools }}</tools>{% endif %} <tool_call>", "hermes"),
    ("{%- if tools %}[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]", "mistral"),
    ('{{- "<|python_tag|>" }}{%- if message.role == "ipython" %}', "llama3_json"),
    ("{% for tool in tools %}{{ tool | tojson }}{% endfor %}", "hermes"),
    ("{% for message in messages %}{{ message.content }}{% endfor %}", None),
    (None, None),
])
def test_detect_format_from_the_chat_template(template, expected):
    assert detect_format(template) == expected


def test_constrained_schema_named_function_required_and_parallel():
    named = constrained_schema([WEATHER, TIME], {"type": "function", "function": {"name": "get_weather"}}, parallel=True)
    assert named["properties"]["name"] == {"const": "get_weather"}
    assert named["properties"]["arguments"] == WEATHER["function"]["parameters"]
    required = constrained_schema([WEATHER, TIME], "required", parallel=False)
    assert [option["properties"]["name"]["const"] for option in required["anyOf"]] == ["get_weather", "get_time"]
    several = constrained_schema([WEATHER], "required", parallel=True)
    assert several["type"] == "array" and several["minItems"] == 1
    assert several["items"]["properties"]["name"] == {"const": "get_weather"}
