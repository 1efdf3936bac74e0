"""The openai_remote backend: ``spec`` (definition and rules) and ``engine`` (an OpenAI-compatible API over HTTP)."""
