"""The exact command line of a managed server with ``embeddings: true``: llama-server's
--embeddings (with --pooling mean for a GGUF that declares no pooling), vLLM's --runner pooling."""
from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from runtime.backends.llama_server.spec import llama_server_command
from runtime.backends.vllm_serve.spec import vllm_serve_command
from tests.managed.helpers import TARGET
from tests.managed.test_commands import BASE, HOST, LLAMA_BASE, PORT, VLLM_BASE, effective

LLAMA_DEFAULTS = ["--parallel", "1", "-c", "4096", "--flash-attn", "auto", "--jinja"]


def header_only_gguf(path: Path, pooling: int | None) -> str:
    """A GGUF header (no tensors) that declares ``llama.pooling_type`` = ``pooling``, or none."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    if pooling is not None:
        writer.add_pooling_type(gguf.PoolingType(pooling))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_embeddings_off_by_default_adds_nothing():
    config = effective("llama_server", {"model_path": "/models/m.gguf"}, {})
    assert config["embeddings"] is False
    assert llama_server_command(config, HOST, PORT, BASE) == [*LLAMA_BASE, *LLAMA_DEFAULTS]


def test_an_unreadable_model_file_gets_embeddings_only():
    config = effective("llama_server", {"model_path": "/models/m.gguf", "embeddings": True}, {})
    assert llama_server_command(config, HOST, PORT, BASE) == [*LLAMA_BASE, *LLAMA_DEFAULTS, "--embeddings"]


@pytest.mark.parametrize(("pooling", "flags"), [
    (None, ["--embeddings", "--pooling", "mean"]),  # a generative model (SmolLM2): llm-pool pools by mean
    (0, ["--embeddings", "--pooling", "mean"]),  # declares "none"
    (1, ["--embeddings"]),  # mean, its own
    (2, ["--embeddings"]),  # cls, its own
    (3, ["--embeddings"]),  # last, its own
    (4, ["--embeddings", "--pooling", "mean"]),  # a reranker's rank: no vector
], ids=["undeclared", "none", "mean", "cls", "last", "rank"])
def test_pooling_follows_the_gguf(tmp_path, pooling, flags):
    model = header_only_gguf(tmp_path / "m.gguf", pooling)
    config = effective(
        "llama_server", {"model_path": model, "embeddings": True, "llama_server_extra_args": ["--jinja"]}, {}
    )
    assert llama_server_command(config, HOST, PORT, BASE) == [
        "llama-server", "--model", model, "--host", HOST, "--port", "8100", *LLAMA_DEFAULTS, *flags, "--jinja",
    ]


def test_vllm_serve_runs_the_pooling_runner():
    config = effective(
        "vllm_serve", {"vllm_serve_model": TARGET, "embeddings": True, "vllm_serve_extra_args": ["--seed", "1"]}, {}
    )
    assert vllm_serve_command(config, HOST, PORT, BASE) == [
        *VLLM_BASE, "--max-num-seqs", "1", "--tensor-parallel-size", "1", "--dtype", "auto",
        "--runner", "pooling", "--seed", "1",
    ]
    plain = effective("vllm_serve", {"vllm_serve_model": TARGET}, {})
    assert "--runner" not in vllm_serve_command(plain, HOST, PORT, BASE)
