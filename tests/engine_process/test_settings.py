"""The definition fields of engine processes: isolation and the stub's crash injection."""
from __future__ import annotations

import pytest

from runtime.backends import BACKENDS
from runtime.config import validate_settings
from runtime.errors import InvalidSettings


@pytest.mark.parametrize("isolation", [{}, {"isolation": "none"}])
def test_crash_injection_is_refused_without_an_engine_process(isolation):
    """It would kill the runtime (and, embedded, the API and admin with it)."""
    with pytest.raises(InvalidSettings) as refused:
        validate_settings({"models": {"m": {"backend": "stub", "stub_crash": "on_load", **isolation}}})
    assert refused.value.details == [{
        "path": "$.models.m",
        "message": "Value error, stub_crash='on_load' needs isolation \"process\": "
                   "with isolation 'none' the crash would kill the service",
    }]


def test_crash_injection_in_an_engine_process_defaults_to_sigsegv():
    settings = validate_settings({"models": {
        "m": {"backend": "stub", "isolation": "process", "stub_crash": "on_generate"},
        "n": {"backend": "stub", "isolation": "process", "stub_crash": "on_load", "stub_crash_signal": "SIGKILL"},
    }})
    assert (settings.models["m"].stub_crash_signal, settings.models["n"].stub_crash_signal) == ("SIGSEGV", "SIGKILL")


@pytest.mark.parametrize("field, value", [("stub_crash_signal", "SIGTERM"), ("stub_crash", "on_unload"),
                                          ("isolation", "thread")])
def test_unknown_values_are_refused_naming_the_field(field, value):
    with pytest.raises(InvalidSettings) as refused:
        validate_settings({"models": {"m": {"backend": "stub", "isolation": "process", field: value}}})
    assert [problem["path"] for problem in refused.value.details] == [f"$.models.m.{field}"]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_isolation_defaults_to_none_for_every_backend_for_now(backend):
    assert BACKENDS[backend].definition_model.model_fields["isolation"].default == "none"
