"""The llama_cpp backend: ``spec`` (definition, live-load rules, VRAM estimate), ``engine``
(one worker thread per replica) and ``native`` (weights, context and sampler over
llama-cpp-python's C API, imported only when a model loads)."""
from __future__ import annotations

from runtime.backends.llama_cpp.spec import GGML_CACHE_TYPES, LlamaCppSpec

__all__ = ["GGML_CACHE_TYPES", "LlamaCppSpec"]
