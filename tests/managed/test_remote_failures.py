"""openai_remote's own failures (runtime/backends/openai_remote/engine.py): a remote that cannot be
reached and one that does not answer in time are upstream_error, for generate and embed alike."""
from __future__ import annotations

import socket

import pytest

from runtime.backends import BACKENDS
from runtime.backends.openai_remote.engine import OpenaiRemoteEngine
from runtime.errors import UpstreamError
from runtime.inputs.request import GenerationRequest


def engine_for(base_url: str, timeout: float) -> OpenaiRemoteEngine:
    spec = BACKENDS["openai_remote"]
    definition = spec.definition_model.model_validate({
        "backend": "openai_remote", "remote_base_url": base_url, "remote_model": "m",
        "remote_timeout_seconds": timeout, "embeddings": True,
    })
    return OpenaiRemoteEngine("far", spec.effective_config(definition, {}))


async def calls(engine: OpenaiRemoteEngine):
    request = GenerationRequest("r", [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
                                max_output_tokens=4, temperature=0.0, top_p=1.0)
    with pytest.raises(UpstreamError) as generated:
        async for _ in engine.generate(request):
            pass
    with pytest.raises(UpstreamError) as embedded:
        await engine.embed(["hi"])
    return str(generated.value), str(embedded.value)


@pytest.fixture
def silent_port():
    """A port that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


async def test_an_unreachable_remote_is_upstream_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens once the probe is closed
    engine = engine_for(f"http://127.0.0.1:{port}/v1", 5.0)
    await engine.load()
    try:
        for message in await calls(engine):
            assert message.startswith(f"cannot reach the remote of model far (http://127.0.0.1:{port}/v1)")
    finally:
        await engine.unload()


async def test_a_remote_that_does_not_answer_in_time_is_upstream_error(silent_port):
    engine = engine_for(f"http://127.0.0.1:{silent_port}/v1", 0.3)
    await engine.load()
    try:
        for message in await calls(engine):
            assert message == f"the remote of model far (http://127.0.0.1:{silent_port}/v1) did not answer within 0.3 s"
    finally:
        await engine.unload()
