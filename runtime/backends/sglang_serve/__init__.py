"""The sglang_serve backend: SGLang's server as a managed subprocess (``spec``)."""
