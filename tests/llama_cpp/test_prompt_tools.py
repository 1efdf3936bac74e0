"""Tools in llama_cpp prompts: a template that takes tools gets them; every other format gets
them as Hermes text (runtime/inputs/prompt_formats.py)."""
from __future__ import annotations

import json

import pytest

from runtime.errors import InvalidRequest
from runtime.pool.gguf_info import read_gguf_info
from runtime.inputs.prompt_formats import (
    ChatMessage,
    GgufChatTemplate,
    conversation_turns,
    render_prompt,
    tool_call_format,
)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}}
CALL = {"id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
HISTORY = [
    ChatMessage("system", "Be brief."),
    ChatMessage("user", "Weather in Oslo?"),
    ChatMessage("assistant", "", tool_calls=(CALL,)),
    ChatMessage("tool", '{"temp": 3}', tool_call_id="call_1"),
]
# The tool parts of Qwen 2.5's template, shortened: it names tools and reads calls' arguments as objects.
QWEN_LIKE = (
    "{%- if tools %}<|im_start|>system\n{{ messages[0].content }}\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools><|im_end|>\n{%- endif %}"
    "{%- for message in messages[1:] %}"
    "{%- if message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{%- elif message.tool_calls %}<|im_start|>assistant\n{%- for call in message.tool_calls %}"
    "<tool_call>\n{\"name\": \"{{ call.function.name }}\", \"arguments\": {{ call.function.arguments | tojson }}}\n</tool_call>"
    "{%- endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}{%- endfor %}"
    "<|im_start|>assistant\n"
)


def test_a_template_that_takes_tools_gets_them_and_the_calls_as_objects():
    template = GgufChatTemplate(QWEN_LIKE, "", "<|im_end|>")
    text = render_prompt("gguf_template", HISTORY, gguf_template=template, tools=[WEATHER]).text
    assert json.dumps(WEATHER, ensure_ascii=False) in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in text
    assert '<|im_start|>user\n<tool_response>\n{"temp": 3}\n</tool_response>' in text
    assert tool_call_format("gguf_template", template) == "hermes"


def test_smollm2s_template_takes_no_tools_so_they_come_as_hermes_text(smollm2_gguf):
    template = GgufChatTemplate(read_gguf_info(str(smollm2_gguf)).chat_template, "<|im_start|>", "<|im_end|>")
    text = render_prompt("gguf_template", HISTORY, gguf_template=template, tools=[WEATHER]).text
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert f"<tools>\n{json.dumps(WEATHER, ensure_ascii=False)}\n</tools>" in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in text
    assert '<|im_start|>user\n<tool_response>\n{"temp": 3}\n</tool_response><|im_end|>' in text
    assert text.endswith("<|im_start|>assistant\n")
    assert tool_call_format("gguf_template", template) == "hermes"


def test_consecutive_results_share_one_user_turn_and_text_before_a_call_stays():
    history = [
        ChatMessage("user", "Both?"),
        ChatMessage("assistant", "Checking.", tool_calls=(CALL, {**CALL, "id": "call_2", "arguments": '{"city": "Rome"}'})),
        ChatMessage("tool", "3", tool_call_id="call_1"),
        ChatMessage("tool", "20", tool_call_id="call_2"),
    ]
    text = render_prompt("generic", history, tools=[WEATHER]).text
    assert "Assistant: Checking.\n<tool_call>" in text and text.count("<tool_call>\n") == 2 + 1  # + the prompt's example
    assert "User: <tool_response>\n3\n</tool_response>\n<tool_response>\n20\n</tool_response>" in text
    assert text.startswith("System: # Tools")  # no system message of its own: the tools' alone


def test_without_tools_a_conversation_is_rendered_as_before():
    plain = [ChatMessage("user", "Hi")]
    assert render_prompt("generic", plain, tools=None).text == "User: Hi\n\nAssistant:"


def test_arguments_that_are_not_json_are_the_requests_400():
    broken = [ChatMessage("user", "x"), ChatMessage("assistant", "", tool_calls=({**CALL, "arguments": "{oops"},)),
              ChatMessage("tool", "1", tool_call_id="call_1")]
    with pytest.raises(InvalidRequest, match="call_1"):
        render_prompt("generic", broken, tools=[WEATHER])


def test_conversation_turns_keep_calls_and_result_ids():
    messages = [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"role": "assistant", "content": [], "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "input_text", "text": "3"}]},
    ]
    turns = conversation_turns(None, messages)
    assert turns[1] == ChatMessage("assistant", "", tool_calls=(CALL,))
    assert turns[2] == ChatMessage("tool", "3", tool_call_id="call_1")
