"""A model's context length and GGUF description (runtime.pool.model_card): the backend's own
figure from the effective config (the load override included), a managed server's declared
limit, else the GGUF file's trained context; the file's architecture, size label, quantization."""
from __future__ import annotations

import gguf

from runtime.backends import BACKENDS
from runtime.pool.catalog import CatalogEntry
from runtime.pool.model_card import context_length, model_file


def entry(folder, **fields) -> CatalogEntry:
    model = BACKENDS[fields["backend"]].definition_model.model_validate(fields)
    return CatalogEntry(name="m", definition=model, sources=("settings.json",), base_dir=str(folder))


def gguf_file(path, *, trained: int = 32768):
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(trained)
    writer.add_basename("Tiny")
    writer.add_size_label("1.5B")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_backends_figure_comes_first_with_the_load_override(tmp_path):
    gguf_file(tmp_path / "m.gguf")
    llama = entry(tmp_path, backend="llama_cpp", model_path="m.gguf", gguf_n_ctx=4096)
    assert context_length(llama, {}) == 4096
    assert context_length(llama, {"gguf_n_ctx": 1024}) == 1024
    server = entry(tmp_path, backend="llama_server", model_path="m.gguf", llama_server_n_ctx=8192, target_inflight=4)
    assert context_length(server, {}) == 2048  # one slot's share


def test_a_declared_server_limit_then_the_trained_context(tmp_path):
    gguf_file(tmp_path / "m.gguf", trained=32768)
    assert context_length(entry(tmp_path, backend="vllm", model_path="m.gguf", vllm_max_model_len=16384), {}) == 16384
    assert context_length(entry(tmp_path, backend="vllm", model_path="m.gguf"), {}) == 32768
    assert context_length(entry(tmp_path, backend="stub"), {}) is None
    assert context_length(entry(tmp_path, backend="stub", stub_context_length=512), {}) == 512


def test_the_gguf_file_describes_itself(tmp_path):
    path = gguf_file(tmp_path / "m.gguf")
    card = model_file(entry(tmp_path, backend="llama_cpp", model_path="m.gguf"))
    assert card == {
        "format": "gguf", "size_bytes": path.stat().st_size, "architecture": "qwen2", "basename": "Tiny",
        "size_label": "1.5B", "quantization": "Q4_K_M", "trained_context_length": 32768,
    }
    assert model_file(entry(tmp_path, backend="llama_cpp", model_path="missing.gguf")) is None
    assert model_file(entry(tmp_path, backend="stub")) is None
