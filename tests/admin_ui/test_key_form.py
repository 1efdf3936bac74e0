"""The workbench's create form read into a key's fields (``workbench.keys.form_fields``): blanks
are null, numbers are numbers, and what is not a number stays text for the key's schema to refuse."""
from __future__ import annotations

import pytest

from models_app import services
from models_app.workbench.keys import form_fields
from runtime.errors import InvalidRequest


def test_the_weight_and_the_queue_timeout_are_read_as_numbers():
    fields = form_fields({"name": "night", "models": "a, b", "weight": "2", "queue_timeout_seconds": "0.5",
                          "requests_per_minute": "60", "priority": "batch"})
    assert (fields["weight"], fields["queue_timeout_seconds"], fields["requests_per_minute"]) == (2.0, 0.5, 60)
    assert services.validated_key_fields(fields)["queue_timeout_seconds"] == 0.5
    blank = form_fields({"name": "plain"})
    assert (blank["weight"], blank["queue_timeout_seconds"], blank["models"]) == (None, None, "*")


@pytest.mark.parametrize("value", ["soon", "0", "-1", "86401"])
def test_a_queue_timeout_the_schema_refuses_is_refused(value):
    with pytest.raises(InvalidRequest) as refused:
        services.validated_key_fields(form_fields({"name": "x", "queue_timeout_seconds": value}))
    assert refused.value.param == "queue_timeout_seconds"


def test_a_limit_of_thousands_of_digits_is_refused_by_the_schema_not_a_500():
    with pytest.raises(InvalidRequest) as refused:
        services.validated_key_fields(form_fields({"name": "x", "requests_per_minute": "9" * 5000}))
    assert refused.value.param == "requests_per_minute"
