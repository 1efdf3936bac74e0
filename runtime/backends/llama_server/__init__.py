"""The llama_server backend: llama.cpp's server as a managed subprocess (``spec``)."""
