"""Ollama's API (``/api/*``): a translation onto the one typed request, as every protocol is.

``protocol`` parses the bodies into ``GenerationRequest`` (and the embed request), ``shapes``
writes Ollama's answers (NDJSON streams, the final object's durations, ``{"error": ...}``),
``models`` the model listings (tags, show, ps) from the runtime's admin entries, and
``endpoint`` serves them (its ``OLLAMA_ROUTES`` go into ``api.routes``).
"""
