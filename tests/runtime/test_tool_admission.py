"""Tools in the runtime: capabilities.tools / tool_choice per backend, admission's refusals and
its tool-result-last rule, the stub's scripted calls, the engines' formats (format_for) and the
parser's rule for the whitespace before a call."""
from __future__ import annotations

import json

import pytest

from runtime.inference.admission import check_request, estimate_prompt_tokens
from runtime.backends import BACKENDS
from runtime.backends.base import Finished, TextDelta
from runtime.backends.stub.spec import StubEngine
from runtime.pool.catalog import CatalogEntry
from runtime.errors import InvalidRequest, ToolsUnsupported
from runtime.inputs.request import GenerationRequest
from runtime.inference.tool_calls import ToolCallParser, choice_kind, format_for

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
USER = {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]}
CALLED = {"role": "assistant", "content": [], "tool_calls": [{"id": "c1", "name": "get_weather", "arguments": "{}"}]}
RESULT = {"role": "tool", "content": [{"type": "input_text", "text": "sunny"}], "tool_call_id": "c1"}


def entry(**fields) -> CatalogEntry:
    model = BACKENDS["stub"].definition_model.model_validate({"backend": "stub", **fields})
    return CatalogEntry(name="m", definition=model, sources=("settings.json",), base_dir="/")


def request(messages=(USER,), **fields) -> GenerationRequest:
    return GenerationRequest("r", list(messages), **fields).resolved()


def test_capabilities_default_to_no_tools_and_choice_none_only():
    for backend in ("vllm", "exllamav3", "ct2"):
        spec = BACKENDS[backend]
        assert spec.tools(None) is False and spec.tool_choices(None) == ["none"]
    stub = BACKENDS["stub"]
    assert stub.capabilities(entry().definition)["tools"] is False
    assert stub.capabilities(entry(stub_tool_calls=[]).definition)["tools"] is True
    assert stub.capabilities(entry(tools=True).definition)["tool_choice"] == ["none", "auto", "required", "function"]
    assert stub.capabilities(entry(tools=True, tool_choice=["none", "auto"]).definition)["tool_choice"] == ["none", "auto"]


def test_admission_refuses_tools_and_tool_turns_for_a_model_without_them():
    plain = entry()
    with pytest.raises(ToolsUnsupported) as refused:
        check_request(plain, request(tools=TOOLS), allow_remote=True)
    assert refused.value.param == "tools"
    check_request(plain, request(tools=TOOLS, tool_choice="none"), allow_remote=True)  # the tools ignored
    with pytest.raises(ToolsUnsupported) as refused:
        check_request(plain, request([USER, CALLED, RESULT]), allow_remote=True)
    assert refused.value.param == "messages[1]"


def test_admission_refuses_a_choice_the_model_does_not_honour():
    auto_only = entry(tools=True, tool_choice=["none", "auto"])
    check_request(auto_only, request(tools=TOOLS, tool_choice="auto"), allow_remote=True)
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        with pytest.raises(ToolsUnsupported) as refused:
            check_request(auto_only, request(tools=TOOLS, tool_choice=choice), allow_remote=True)
        assert refused.value.param == "tool_choice"


def test_a_conversation_may_end_with_a_tool_result_but_not_with_the_call():
    tooler = entry(tools=True)
    check_request(tooler, request([USER, CALLED, RESULT], tools=TOOLS), allow_remote=True)
    with pytest.raises(InvalidRequest) as refused:
        check_request(tooler, request([USER, CALLED], tools=TOOLS), allow_remote=True)
    assert refused.value.param == "input"


def test_the_fair_share_estimate_counts_tools_and_call_arguments():
    bare = estimate_prompt_tokens(request([USER]))
    assert estimate_prompt_tokens(request([USER], tools=TOOLS)) > bare
    long_call = dict(CALLED, tool_calls=[{"id": "c1", "name": "f", "arguments": json.dumps({"x": "y" * 400})}])
    assert estimate_prompt_tokens(request([USER, long_call, RESULT])) >= bare + 100


def test_format_for_maps_choice_kinds():
    formats = {"auto": "hermes", "required": "json", "function": "json"}
    assert [choice_kind(choice) for choice in (None, "none", "auto", "required", {"type": "function"})] == [
        "auto", "none", "auto", "required", "function"]
    assert format_for(formats, request(tools=TOOLS)) == "hermes"
    assert format_for(formats, request(tools=TOOLS, tool_choice="required")) == "json"
    assert format_for(formats, request(tools=TOOLS, tool_choice="none")) is None
    assert format_for(formats, request()) is None  # no tools offered
    assert format_for(None, request(tools=TOOLS)) is None


async def stub_answer(engine: StubEngine, req: GenerationRequest) -> tuple[list[str], Finished]:
    pieces, finished = [], None
    async for event in engine.generate(req):
        if isinstance(event, TextDelta):
            pieces.append(event.text)
        else:
            finished = event
    return pieces, finished


async def test_the_stub_writes_its_calls_in_hermes_over_several_pieces_and_answers_a_result_with_text():
    definition = entry(stub_tool_calls=[{"name": "get_weather", "arguments": {"city": "Oslo"}}]).definition
    engine = StubEngine(definition.model_dump(), 0)
    await engine.load()
    pieces, finished = await stub_answer(engine, request(tools=TOOLS))
    assert "".join(pieces) == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert pieces[:2] == ["<tool", "_call>\n"] and finished.output_tokens == len(pieces)
    assert engine.tool_call_format(request(tools=TOOLS, tool_choice="required")) == "hermes"
    assert engine.tool_call_format(request(tools=TOOLS, tool_choice="none")) is None
    answer, _ = await stub_answer(engine, request([USER, CALLED, RESULT], tools=TOOLS))
    assert "".join(answer) == "sunny"
    text, _ = await stub_answer(engine, request(tools=TOOLS, tool_choice="none"))
    assert "".join(text) == "weather?"


def parse(pieces: list[str]) -> tuple[list[str], list]:
    parser = ToolCallParser("hermes", ["get_weather"])
    texts, calls = [], []
    for piece in pieces:
        text, done = parser.feed(piece)
        texts.append(text)
        calls += done
    text, done = parser.finish()
    return [*texts, text], calls + done


def test_the_whitespace_before_a_call_is_the_calls():
    block = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    texts, calls = parse(["Checking.\n", "\n", block])
    assert "".join(texts) == "Checking." and len(calls) == 1
    texts, calls = parse(["Checking.\n", "<tool", "_call>", '{"name": "get_weather", "arguments": {}}', "</tool_call>"])
    assert "".join(texts) == "Checking." and len(calls) == 1


def test_the_whitespace_before_a_broken_call_or_at_the_end_stays():
    texts, calls = parse(["Checking.\n", "<tool_call>{oops}</tool_call>"])
    assert "".join(texts) == "Checking.\n<tool_call>{oops}</tool_call>" and calls == []
    texts, calls = parse(["line one\n", "line two\n"])
    assert "".join(texts) == "line one\nline two\n" and texts[0] == "line one"  # held until the next piece
