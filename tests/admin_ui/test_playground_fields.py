"""The playground's decoding fields: the base ones, then the sampling options the model's
capabilities list (top_k and repeat_penalty among them), in a fixed order."""
from __future__ import annotations

import pytest

from models_app.workbench.playground import playground_context

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("options", "shown"), [
    (["top_k", "repeat_penalty"], ["top_k", "repeat_penalty"]),
    (["repeat_penalty", "seed", "logprobs"], ["seed", "repeat_penalty"]),  # logprobs has no field
    ([], []),
])
def test_the_sampling_fields_are_those_the_models_capabilities_list(options, shown):
    entry = {"capabilities": {"sampling_options": options}, "definition": {}}
    names = [field["name"] for field in playground_context(entry)["numbers"]]
    assert names == ["max_tokens", "temperature", "top_p", *shown]
