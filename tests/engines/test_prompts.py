"""The prompt helpers of runtime.backends.shared.prompts: chat-template messages, the thinking switch, tokenizer templates."""
from __future__ import annotations

import json

import pytest

from runtime.backends.base import GenerationRequest
from runtime.backends.shared.prompts import ChatTemplate, template_messages, template_variables
from runtime.errors import BackendError, ModalityUnsupported

CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def request(messages, **fields) -> GenerationRequest:
    return GenerationRequest(request_id="r", messages=messages, **{"max_output_tokens": 256, **fields}).resolved()


def test_template_messages_put_instructions_first_and_map_roles():
    messages = [
        {"role": "developer", "content": [{"type": "input_text", "text": "Use French."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Hello "}, {"type": "input_text", "text": "you"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Bonjour"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Again"}]},
    ]
    assert template_messages(request(messages, instructions="Be brief.")) == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use French."},
        {"role": "user", "content": "Hello you"},
        {"role": "assistant", "content": "Bonjour"},
        {"role": "user", "content": "Again"},
    ]


def test_template_messages_refuse_images():
    image = [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}]
    with pytest.raises(ModalityUnsupported):
        template_messages(request(image))


@pytest.mark.parametrize(
    "thinking, configured, expected",
    [
        ("enabled", False, {"enable_thinking": True}),
        ("disabled", True, {"enable_thinking": False}),
        ("default", False, {"enable_thinking": False}),
        ("default", True, {"enable_thinking": True}),
        ("default", None, {}),
    ],
)
def test_the_thinking_switch(thinking, configured, expected):
    assert template_variables(request([], thinking=thinking), configured) == expected


def test_a_tokenizer_folder_template_with_added_token_dicts(tmp_path):
    config = {"chat_template": CHATML, "bos_token": {"content": "<s>", "lstrip": False}, "eos_token": "</s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    template = ChatTemplate.from_folder(str(tmp_path))
    assert (template.bos_token, template.eos_token) == ("<s>", "</s>")
    assert template.render([{"role": "user", "content": "hi"}]) == "<|im_start|>user\nhi<|im_end|>\n"


def test_the_template_may_live_in_chat_template_jinja(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    (tmp_path / "chat_template.jinja").write_text(CHATML)
    assert ChatTemplate.from_folder(str(tmp_path)).template == CHATML


def test_named_templates_use_the_default_one(tmp_path):
    named = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": CHATML}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    assert ChatTemplate.from_folder(str(tmp_path)).template == CHATML


def test_a_folder_without_template_or_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match="cannot read the tokenizer config"):
        ChatTemplate.from_folder(str(tmp_path))
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ValueError, match="has no chat template"):
        ChatTemplate.from_folder(str(tmp_path))


def test_a_template_the_sandbox_refuses_is_the_models_fault(tmp_path):
    evil = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": evil}))
    with pytest.raises(BackendError, match="chat template is refused"):
        ChatTemplate.from_folder(str(tmp_path)).render([{"role": "user", "content": "hi"}])
