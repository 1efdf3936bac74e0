"""Tool calling for real: llama-server (the cached build) started with --jinja serving SmolLM2,
with tool_choice "required", through llm-pool's chat completions pass-through and the official
openai client, and on the typed path (the runtime's result).  Mechanics, not words: a call
comes back with arguments that parse as JSON and match the tool's schema.

SmolLM2's own chat template takes no tools, so the model gets a ChatML template that does
(``--chat-template-file`` in the extra args); llama-server's "required" grammar still lets
text come before a call, so the conversation shows the model three earlier calls first.
"""
from __future__ import annotations

import json

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk


TOOLS_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}{% if messages[0].role == 'system' %}{{ messages[0].content + '\\n\\n' }}{% endif %}
{{- '# Tools\\n\\nYou may call functions. Their signatures are within <tools></tools>:\\n<tools>' }}
{%- for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}
{{- '\\n</tools>\\n\\nAnswer a call as a JSON object within <tool_call></tool_call> tags:\\n<tool_call>\\n' }}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}{% if message.content %}{{ '\\n' + message.content }}{% endif %}
{%- for call in message.tool_calls %}{% set call = call.function if call.function is defined else call %}
{{- '\\n<tool_call>\\n{"name": "' + call.name + '", "arguments": ' + (call.arguments | tojson) + '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\\nResult: ' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}
"""
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "weather", "description": "Get the weather of a city",
                                            "parameters": CITY}}
LOCAL_TIME = {"type": "function", "function": {"name": "local_time", "description": "Get the local time of a city",
                                               "parameters": CITY}}


def earlier_calls() -> list[dict]:
    """Three turns in which the assistant called weather, then the question (chat shape)."""
    messages = []
    for index, city in enumerate(("Rome", "Lima", "Cairo")):
        call = {"id": f"c{index}", "type": "function",
                "function": {"name": "weather", "arguments": json.dumps({"city": city})}}
        messages += [
            {"role": "user", "content": f"What is the weather in {city}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{index}", "content": "sunny"},
            {"role": "assistant", "content": f"It is sunny in {city}."},
        ]
    return [*messages, {"role": "user", "content": "What is the weather in Oslo?"}]


def assert_arguments_match_the_schema(arguments: str) -> None:
    parsed = json.loads(arguments)
    assert isinstance(parsed, dict) and isinstance(parsed["city"], str)


def smol_definition(llama_server_binary, smollm2_gguf, tmp_path) -> dict:
    template = tmp_path / "chatml_tools.jinja"
    template.write_text(TOOLS_TEMPLATE)
    return {
        "backend": "llama_server", "model_path": smollm2_gguf, "llama_server_binary": llama_server_binary,
        "llama_server_n_ctx": 2048, "llama_server_startup_timeout_seconds": 60.0, "target_inflight": 1,
        "llama_server_extra_args": ["--chat-template-file", str(template)],
    }


@pytest.fixture
def smol(live_service, llama_server_binary, smollm2_gguf, tmp_path):
    model = smol_definition(llama_server_binary, smollm2_gguf, tmp_path)
    service = live_service({"smol": model}, env={"LLMPOOL_STATE_DIR": str(tmp_path / "state")})
    with service.client(timeout=120) as http:
        loaded = http.post("/v1/admin/models/smol/load").json()
        assert loaded["runtime_state"] == "loaded", loaded
        capabilities = loaded["capabilities"]
        assert (capabilities["tools"], capabilities["tool_choice"]) == (True, ["none", "auto", "required", "function"])
    yield service
    assert service.stop() == 0


def test_required_tool_calls_pass_through_with_arguments_that_parse(smol):
    with openai.OpenAI(base_url=smol.url + "/v1", api_key="x", max_retries=0, timeout=120) as client:
        fields = {"model": "smol", "messages": earlier_calls(), "tools": [WEATHER, LOCAL_TIME],
                  "tool_choice": "required", "max_tokens": 60, "temperature": 0}
        raw = client.chat.completions.with_raw_response.create(**fields)
        completion = ChatCompletion.model_validate(json.loads(raw.text), strict=True)
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.tool_calls and {call.function.name for call in choice.message.tool_calls} <= {
            "weather", "local_time"}
        for call in choice.message.tool_calls:
            assert call.type == "function" and call.id
            assert_arguments_match_the_schema(call.function.arguments)

        # Streamed: index, id and name first, then the arguments in fragments, as OpenAI streams them.
        chunks = [ChatCompletionChunk.model_validate(chunk.model_dump(), strict=True)
                  for chunk in client.chat.completions.create(**fields, stream=True)]
        fragments = [call for chunk in chunks if chunk.choices for call in chunk.choices[0].delta.tool_calls or ()]
        assert fragments[0].index == 0 and fragments[0].id and fragments[0].function.name
        arguments = "".join(fragment.function.arguments or "" for fragment in fragments if fragment.index == 0)
        assert_arguments_match_the_schema(arguments)
        assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "tool_calls"

        # A named function: llama-server reads only "required", so it gets that tool alone.
        named = client.chat.completions.create(
            **{**fields, "tool_choice": {"type": "function", "function": {"name": "local_time"}}}
        )
        calls = named.choices[0].message.tool_calls
        assert calls and {call.function.name for call in calls} == {"local_time"}
        for call in calls:
            assert_arguments_match_the_schema(call.function.arguments)


def typed_messages() -> list[dict]:
    """``earlier_calls`` in the typed request's shape (what a Responses body is parsed into)."""
    typed = []
    for message in earlier_calls():
        content = [{"type": "input_text", "text": message["content"]}] if message["content"] else []
        entry = {"role": message["role"], "content": content}
        if message.get("tool_calls"):
            entry["tool_calls"] = [{"id": call["id"], "name": call["function"]["name"],
                                    "arguments": call["function"]["arguments"]} for call in message["tool_calls"]]
        if message["role"] == "tool":
            entry["tool_call_id"] = message["tool_call_id"]
        typed.append(entry)
    return typed


async def test_the_typed_path_reads_llama_servers_calls(
    llama_server_binary, smollm2_gguf, tmp_path, state_dir, runtime_service
):
    service, _ = await runtime_service({"smol": smol_definition(llama_server_binary, smollm2_gguf, tmp_path)})
    await service.handle("load", {"name": "smol", "body": None}, None)
    argv = service.pool.controller("smol").engines[0].process.command.argv
    assert "--jinja" in argv
    payload = {"model": "smol", "messages": typed_messages(), "tools": [WEATHER, LOCAL_TIME],
               "tool_choice": "required", "max_output_tokens": 60, "temperature": 0.0}
    for stream, choice in ((False, "required"), (True, {"type": "function", "function": {"name": "local_time"}})):
        emitted: list[dict] = []

        async def emit(event: dict) -> None:
            emitted.append(event)

        result = await service.handle("generate", {**payload, "request_id": f"r{stream}", "stream": stream,
                                                   "tool_choice": choice}, emit)
        assert result["finish_reason"] == "tool_calls" and result["tool_calls"]
        for call in result["tool_calls"]:
            assert call["id"] and call["name"] in ("weather", "local_time")
            assert_arguments_match_the_schema(call["arguments"])
        if stream:
            assert {call["name"] for call in result["tool_calls"]} == {"local_time"}
            assert [e["call"] for e in emitted if e["event"] == "tool_call"] == result["tool_calls"]
