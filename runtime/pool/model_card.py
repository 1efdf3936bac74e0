"""What a model tells clients about itself besides its capabilities: the context one request may
use, and what its local GGUF file says of itself.  Clients size their prompts by the context
(Copilot, Zed, Continue read it from a model list; Ollama clients from ``/api/show``).

``context_length`` is, in this order: what the backend derives from the effective config (the
definition with the current load's override: llama_cpp's ``gguf_n_ctx``, one llama-server slot's
share of ``llama_server_n_ctx``), the limit a managed server is started with where the definition
sets it, else what the GGUF file was trained with (``<arch>.context_length``); None when none is
known.  ``model_file`` describes a local GGUF file (None for anything else).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import gguf

from runtime.pool.gguf_info import GgufError, GgufInfo, read_gguf_info
from runtime.pool.model_files import locate_model_file

if TYPE_CHECKING:
    from runtime.pool.catalog import CatalogEntry

# Definition fields that cap a server's context where the backend does not derive one itself.
_DECLARED_LIMITS = ("vllm_max_model_len", "sglang_context_length", "trtllm_max_seq_len")


def context_length(entry: CatalogEntry, load_override: dict[str, Any]) -> int | None:
    spec = entry.spec
    config = spec.effective_config(entry.definition, load_override)
    derived = spec.context_length(config)
    if derived is not None:
        return derived
    for field in _DECLARED_LIMITS:
        if isinstance(config.get(field), int):
            return config[field]
    info = _gguf(entry)
    trained = info.context_length if info is not None else None
    return trained if isinstance(trained, int) else None


def model_file(entry: CatalogEntry) -> dict[str, Any] | None:
    """A local GGUF file's own description: its size, architecture, base name, size label
    ("135M"), quantization ("Q4_1") and trained context; a key the header lacks is None."""
    info = _gguf(entry)
    if info is None:
        return None
    metadata = info.metadata
    return {
        "format": "gguf",
        "size_bytes": info.file_size,
        "architecture": info.architecture,
        "basename": _text(metadata.get(gguf.Keys.General.BASENAME)),
        "size_label": _text(metadata.get(gguf.Keys.General.SIZE_LABEL)),
        "quantization": _quantization(metadata.get(gguf.Keys.General.FILE_TYPE)),
        "trained_context_length": info.context_length if isinstance(info.context_length, int) else None,
    }


def _gguf(entry: CatalogEntry) -> GgufInfo | None:
    path = locate_model_file(getattr(entry.definition, "model_path", None), entry.base_dir)
    if path is None or not path.endswith(".gguf") or not os.path.isfile(path):
        return None
    try:
        return read_gguf_info(path)
    except (OSError, GgufError):
        return None


def _text(value) -> str | None:
    return value if isinstance(value, str) and value else None


def _quantization(file_type) -> str | None:
    """llama.cpp's file type as its quantization's name (``MOSTLY_Q4_K_M`` -> ``Q4_K_M``)."""
    try:
        return gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (ValueError, TypeError):
        return None
