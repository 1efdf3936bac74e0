"""The vllm backend: ``spec`` (the definition fields shared with ``vllm_serve`` and the
live-load rules), ``arguments`` (a definition as engine arguments) and ``engine``
(``AsyncLLM`` in the runtime process; vLLM itself is imported only when a model loads)."""
from __future__ import annotations

from runtime.backends.vllm.spec import VllmFields, VllmSpec

__all__ = ["VllmFields", "VllmSpec"]
