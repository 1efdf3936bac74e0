"""The stub backend: deterministic engines for tests and demos (``spec``)."""
