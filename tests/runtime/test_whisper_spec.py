"""The whisper backend's spec: its definition, capabilities (speech to text only), load overrides
(none) and memory estimate (the model folder's size)."""
from __future__ import annotations

import pytest

from runtime.backends import BACKENDS
from runtime.config import validate_settings
from runtime.errors import InvalidLoadRequest, InvalidSettings

SPEC = BACKENDS["whisper"]


def definition(**fields):
    return SPEC.definition_model.model_validate({"backend": "whisper", "model_path": "/m/whisper", **fields},
                                                strict=True)


def test_defaults_run_in_an_engine_process_with_faster_whispers_defaults():
    configured = definition()
    assert (configured.isolation, configured.whisper_compute_type, configured.whisper_cpu_threads,
            configured.whisper_beam_size, configured.whisper_vad_filter) == ("process", "default", 0, 5, False)
    assert configured.request_timeout_seconds == 600.0  # bounded in an engine process


@pytest.mark.parametrize("model", [
    {"backend": "whisper"},
    {"backend": "whisper", "model_path": "/m", "whisper_beam_size": 0},
    {"backend": "whisper", "model_path": "/m", "whisper_compute_type": "int4"},
    {"backend": "whisper", "model_path": "/m", "embeddings": True},
    {"backend": "whisper", "model_path": "/m", "ct2_intra_threads": 2},
])
def test_bad_definitions_are_invalid_settings(model):
    with pytest.raises(InvalidSettings):
        validate_settings({"models": {"w": model}})


def test_capabilities_say_speech_to_text_only():
    capabilities = SPEC.capabilities(definition())
    assert capabilities["audio_transcription"] is True
    assert (capabilities["embeddings"], capabilities["multi_turn"], capabilities["tools"]) == (False, False, False)
    assert SPEC.generates(definition()) is False
    assert all(spec.generates(None) for name, spec in BACKENDS.items() if name != "whisper")


def test_no_load_overrides():
    assert SPEC.load_constraints(definition()) == {}
    assert SPEC.validate_overrides(definition(), {}) == {}
    with pytest.raises(InvalidLoadRequest):
        SPEC.validate_overrides(definition(), {"whisper_beam_size": 1})


def test_the_memory_estimate_is_the_model_folders_size(tmp_path):
    folder = tmp_path / "whisper-base"
    folder.mkdir()
    (folder / "model.bin").write_bytes(b"\0" * (5 * 1024 * 1024))
    (folder / "tokenizer.json").write_bytes(b"{}")
    configured = definition(model_path="whisper-base")
    assert SPEC.vram_estimate(configured, SPEC.effective_config(configured, {}), 2, str(tmp_path)) == (
        12, "model_artifact_size")
