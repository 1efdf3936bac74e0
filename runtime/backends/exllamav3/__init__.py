"""The exllamav3 backend: ``spec`` (definition and rules) and ``engine`` (ExLlamaV3, imported when a model loads)."""
