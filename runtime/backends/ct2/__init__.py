"""The ct2 backend: ``spec`` (definition and rules) and ``engine`` (CTranslate2 in an engine process)."""
