"""llama.cpp's top_k and repeat_penalty in the bodies that have them (chat completions' llama-server
extension, Anthropic's top_k, Ollama's options): carried into the typed request, a neutral value
(top_k 0, repeat_penalty 1) left out, a value out of bounds refused naming the field."""
from __future__ import annotations

import pytest

from models_app.api.chat.protocol import parse_chat_body
from models_app.api.ollama.protocol import parse_chat
from runtime.errors import InvalidRequest

USER = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return parse_chat_body({"model": "m", "messages": USER, **fields}, None).forwarded.typed


def ollama(**options):
    return parse_chat({"model": "m", "messages": USER, "options": options}, None).generation


@pytest.mark.parametrize("parse", [chat, ollama])
def test_top_k_and_repeat_penalty_are_carried_and_neutral_values_left_out(parse):
    request = parse(top_k=5, repeat_penalty=1.3)
    assert (request.top_k, request.repeat_penalty) == (5, 1.3)
    neutral = parse(top_k=0, repeat_penalty=1.0)
    assert (neutral.top_k, neutral.repeat_penalty) == (None, None)


@pytest.mark.parametrize(("fields", "param"), [
    ({"top_k": -1}, "top_k"), ({"top_k": 1.5}, "top_k"), ({"repeat_penalty": 0}, "repeat_penalty"),
    ({"repeat_penalty": 11}, "repeat_penalty"),
])
def test_out_of_bounds_is_refused_naming_the_field(fields, param):
    with pytest.raises(InvalidRequest) as refused:
        chat(**fields)
    assert refused.value.param == param
    with pytest.raises(InvalidRequest) as refused:
        ollama(**fields)
    assert refused.value.param == f"options.{param}"


def test_a_chat_body_with_them_is_no_longer_refused_as_unknown():
    body = {"model": "m", "messages": USER, "top_k": 5}
    assert parse_chat_body(body, None).forwarded.typed_refusals == []
