"""The recording vLLM fake of tests/engines/engine_fakes.py, for an engine process (see there)."""
from tests.engines.engine_fakes import install_for_engine_process

install_for_engine_process("vllm")
