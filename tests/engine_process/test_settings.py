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


NATIVE_ENGINES = ["ct2", "exllamav3", "llama_cpp", "vllm", "whisper"]
OUT_OF_PROCESS = {
    "llama_server": ({"model_path": "/m.gguf"}, "each replica is a server process of its own already"),
    "vllm_serve": ({"model_path": "/m"}, "each replica is a server process of its own already"),
    "sglang_serve": ({"model_path": "/m"}, "each replica is a server process of its own already"),
    "trtllm_serve": ({"model_path": "/m"}, "each replica is a server process of its own already"),
    "openai_remote": ({"remote_base_url": "http://remote", "remote_model": "m"}, "its model runs on the remote server"),
}


def test_native_engines_default_to_an_engine_process_and_the_others_to_none():
    defaults = {name: spec.definition_model.model_fields["isolation"].default for name, spec in BACKENDS.items()}
    assert defaults == {name: "process" if name in NATIVE_ENGINES else "none" for name in BACKENDS}
    assert sorted([*NATIVE_ENGINES, *OUT_OF_PROCESS, "stub"]) == sorted(BACKENDS)


@pytest.mark.parametrize("backend", sorted(OUT_OF_PROCESS))
def test_an_engine_process_is_refused_where_the_model_runs_outside_the_runtime_already(backend):
    fields, where = OUT_OF_PROCESS[backend]
    with pytest.raises(InvalidSettings) as refused:
        validate_settings({"models": {"m": {"backend": backend, "isolation": "process", **fields}}})
    assert refused.value.details == [{
        "path": "$.models.m",
        "message": f'Value error, isolation "process" does not apply to {backend}: {where}; '
                   'leave isolation out or set it to "none"',
    }]
    for isolation in ({}, {"isolation": "none"}):
        settings = validate_settings({"models": {"m": {"backend": backend, **fields, **isolation}}})
        assert settings.models["m"].isolation == "none"
