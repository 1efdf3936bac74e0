"""The vllm_serve backend: vLLM's server as a managed subprocess (``spec``)."""
