"""A runtime that does not answer is a bounded 503 runtime_unavailable; a busy one keeps the API waiting."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from channels.layers import get_channel_layer

from models_app.conf import service_settings
from models_app import placement
from models_app.transport.messages import (
    OP_GENERATE,
    OP_LIST_MODELS,
    REPLY_HEARTBEAT,
    RUNTIME_CANCEL,
    RUNTIME_CHANNEL,
    RUNTIME_REPLY,
    RUNTIME_REQUEST,
)
from models_app.transport.runtime_client import RuntimeClient
from runtime.errors import RuntimeUnavailable

REPLY_TIMEOUT = 0.3


@pytest.fixture
async def silent_runtime():
    """The in-memory channel layer with nobody listening on the runtime channel; emptied afterwards."""
    layer = get_channel_layer()
    await layer.flush()
    yield layer
    await layer.flush()


@pytest.fixture
def asgi_settings(settings, tmp_path):
    """LLMPOOL_SETTINGS pointing at a file with a short runtime reply timeout (the API reads it once)."""
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"service": {"runtime_reply_timeout_seconds": REPLY_TIMEOUT}, "models": {}}))
    settings.LLMPOOL_SETTINGS = str(path)
    service_settings.cache_clear()
    yield
    service_settings.cache_clear()


async def runtime_messages(layer) -> list[dict]:
    """Everything the API sent to the runtime channel so far."""
    messages = []
    while layer.channels.get(RUNTIME_CHANNEL):
        messages.append(await layer.receive(RUNTIME_CHANNEL))
    return messages


async def test_client_call_raises_runtime_unavailable_within_the_reply_timeout(silent_runtime):
    started = time.monotonic()
    with pytest.raises(RuntimeUnavailable) as caught:
        await placement.call(OP_LIST_MODELS, client=RuntimeClient(reply_timeout=REPLY_TIMEOUT))
    elapsed = time.monotonic() - started
    assert REPLY_TIMEOUT <= elapsed < 1.0
    assert caught.value.http_status == 503
    assert caught.value.retry_after > 0


async def test_client_tells_the_runtime_to_drop_a_request_it_gave_up_on(silent_runtime):
    with pytest.raises(RuntimeUnavailable):
        await placement.call(OP_GENERATE, {"model": "m"}, client=RuntimeClient(reply_timeout=REPLY_TIMEOUT))
    request, cancel = await runtime_messages(silent_runtime)
    assert request["type"] == RUNTIME_REQUEST
    assert request["op"] == OP_GENERATE
    assert cancel == {"type": RUNTIME_CANCEL, "request_id": request["request_id"]}


async def test_exchange_raises_on_its_first_message(silent_runtime):
    exchange = placement.exchange(OP_GENERATE, {"model": "m"}, client=RuntimeClient(reply_timeout=REPLY_TIMEOUT))
    started = time.monotonic()
    with pytest.raises(RuntimeUnavailable):
        await anext(exchange)
    assert time.monotonic() - started < 1.0


async def test_a_runtime_that_acknowledges_but_then_goes_silent_is_unavailable(silent_runtime):
    """Each message restarts the wait; silence after the acknowledgement still ends in 503."""
    client = RuntimeClient(reply_timeout=REPLY_TIMEOUT)
    exchange = client.exchange(RUNTIME_CHANNEL, OP_LIST_MODELS, {})
    waiting = asyncio.create_task(anext(exchange))
    request = await silent_runtime.receive(RUNTIME_CHANNEL)
    for _ in range(3):
        await silent_runtime.send(request["reply_channel"], {"type": RUNTIME_REPLY, "kind": REPLY_HEARTBEAT})
        await asyncio.sleep(REPLY_TIMEOUT / 2)
    assert not waiting.done()
    started = time.monotonic()
    with pytest.raises(RuntimeUnavailable):
        await waiting
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        pytest.param("POST", "/v1/responses", {"model": "m", "input": "hello"}, id="responses"),
        pytest.param("POST", "/v1/responses", {"model": "m", "input": "hello", "stream": True}, id="responses-stream"),
        pytest.param("GET", "/v1/admin/models", None, id="admin-models"),
        pytest.param("GET", "/healthz", None, id="healthz"),
    ],
)
@pytest.mark.django_db(transaction=True)  # an inference request reads the key ring (the keys in the database)
async def test_api_answers_503_runtime_unavailable(silent_runtime, asgi_settings, method, path, body):
    from llmpool.asgi import application

    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        started = time.monotonic()
        answer = await client.request(method, path, json=body)
        elapsed = time.monotonic() - started
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "runtime_unavailable"
    assert set(answer.json()["error"]) == {"code", "message", "param"}
    assert int(answer.headers["Retry-After"]) > 0
    assert REPLY_TIMEOUT <= elapsed < 1.5


def test_heartbeats_keep_long_work_from_looking_unavailable(live_service):
    """A load and a generation each far longer than the reply timeout still answer normally."""
    service = live_service(
        {
            "slowload": {"backend": "stub", "stub_load_seconds": 2},
            "slowgen": {"backend": "stub", "stub_reply": "a b c d e", "stub_token_delay_ms": 300},
        },
        service={"runtime_reply_timeout_seconds": 0.4},
    )
    with service.client() as http:
        started = time.monotonic()
        loaded = http.post("/v1/admin/models/slowload/load")
        assert loaded.status_code == 200, loaded.text
        assert loaded.json()["runtime_state"] == "loaded"
        assert time.monotonic() - started >= 2
        http.post("/v1/admin/models/slowgen/load")
        started = time.monotonic()
        answer = http.post("/v1/responses", json={"model": "slowgen", "input": "x"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["output"][0]["content"][0]["text"] == "a b c d e"
        assert time.monotonic() - started >= 1.5
