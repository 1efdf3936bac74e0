"""What the inference protocols' parsers share (``api.request_body``): a body that is a JSON
object, its first problem as one 400 naming the field, and the OpenAI fields read alike."""
from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field

from models_app.api.request_body import json_object, refuse_changes, refuse_unknown, stop_sequences, validated
from runtime.errors import InvalidRequest


class Body(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    prompt: str | list[str]
    n: int | None = None


@pytest.mark.parametrize("data", [[], "text", 3, None])
def test_a_body_that_is_not_an_object_is_refused(data):
    with pytest.raises(InvalidRequest, match="must be a JSON object"):
        json_object(data)


def test_the_first_problem_names_its_field():
    with pytest.raises(InvalidRequest) as refused:
        validated(Body, {"model": "", "prompt": "x"})
    assert (refused.value.param, refused.value.message) == ("model", "$.model: String should have at least 1 character")


def test_where_drops_what_says_nothing_to_a_client():
    with pytest.raises(InvalidRequest) as refused:
        validated(Body, {"model": "m", "prompt": 3}, where=lambda loc: loc[:1])
    assert refused.value.param == "prompt" and refused.value.message.startswith("$.prompt: ")


def test_a_field_of_several_shapes_has_its_own_message_unless_missing():
    shapes = {"prompt": "$.prompt: a string or a list of strings"}
    with pytest.raises(InvalidRequest) as wrong:
        validated(Body, {"model": "m", "prompt": [1]}, shapes=shapes)
    assert (wrong.value.param, wrong.value.message) == ("prompt", shapes["prompt"])
    with pytest.raises(InvalidRequest) as missing:
        validated(Body, {"model": "m"}, shapes=shapes)
    assert missing.value.message == "$.prompt: Field required"


def test_validation_is_strict():
    with pytest.raises(InvalidRequest, match=r"^\$\.n: "):
        validated(Body, {"model": "m", "prompt": "x", "n": "2"})


def test_refused_fields_are_recorded_in_order():
    body = validated(Body, {"model": "m", "prompt": "x", "n": 2, "echo": True})
    refused = []
    refuse_changes(body, {"n": lambda value: value > 1}, refused)
    refuse_unknown(body, "/v1/completions", refused)
    assert [(error.param, error.message) for error in refused] == [
        ("n", "n is not supported by this model; leave it out"),
        ("echo", "echo is not a field of /v1/completions for this model"),
    ]


@pytest.mark.parametrize(("stop", "sequences"), [
    (None, None), ("", None), ("x", ["x"]), (["a", "", "b"], ["a", "b"]), ([], None),
])
def test_stop_sequences(stop, sequences):
    assert stop_sequences(stop) == sequences
