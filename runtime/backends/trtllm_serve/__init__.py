"""The trtllm_serve backend: TensorRT-LLM's server as a managed subprocess (``spec``)."""
