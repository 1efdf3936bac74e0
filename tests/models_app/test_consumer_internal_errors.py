"""An unexpected exception in the runtime answers ``internal_error`` with the request id only: the
exception's text (a database's message, a path, a secret) stays in the log (issue 23, item 3)."""
from __future__ import annotations

import logging

from models_app.host import consumer, runtime_host
from models_app.transport.channel_layer import InMemoryChannelLayer
from models_app.transport.messages import REPLY_ACK, REPLY_ERROR, RUNTIME_REQUEST


class Failing:
    async def handle(self, op, payload, emit):
        raise RuntimeError("connection to server at 10.0.0.7 failed: password=hunter2")


async def test_an_unexpected_error_answers_the_request_id_and_logs_the_detail(monkeypatch, caplog):
    layer = InMemoryChannelLayer()

    async def ensure_runtime():
        return Failing()

    monkeypatch.setattr(runtime_host, "ensure_runtime", ensure_runtime)
    monkeypatch.setattr(runtime_host, "channel_layer", lambda: layer)
    monkeypatch.setattr(runtime_host, "reply_timeout", lambda: 2.0)
    monkeypatch.setattr(runtime_host, "heartbeat_interval", lambda: 1.0)
    reply = await layer.new_channel()
    message = {"type": RUNTIME_REQUEST, "op": "reload_settings", "payload": {}, "request_id": "req-42",
               "reply_channel": reply}
    with caplog.at_level(logging.ERROR, logger="llmpool.consumer"):
        await consumer._serve(message)
    assert (await layer.receive(reply))["kind"] == REPLY_ACK
    error = await layer.receive(reply)
    assert error["kind"] == REPLY_ERROR
    assert error["data"]["code"] == "internal_error"
    assert error["data"]["message"] == "internal error (request id req-42)"
    assert "hunter2" in caplog.text and "req-42" in caplog.text


async def test_the_runtime_channel_serves_on_after_a_message_it_cannot_handle(monkeypatch, caplog):
    """``serve_channel`` hands each message straight to the consumer's handler; one of a type it has
    no handler for is logged, and the next request on the channel is still served."""
    import asyncio

    layer = InMemoryChannelLayer()
    monkeypatch.setattr(runtime_host, "ensure_runtime", _failing_runtime)
    monkeypatch.setattr(runtime_host, "channel_layer", lambda: layer)
    monkeypatch.setattr(runtime_host, "reply_timeout", lambda: 2.0)
    monkeypatch.setattr(runtime_host, "heartbeat_interval", lambda: 1.0)
    serving = asyncio.create_task(consumer.serve_channel("llmpool-test-runtime", layer))
    try:
        reply = await layer.new_channel()
        with caplog.at_level(logging.ERROR, logger="llmpool.consumer"):
            await layer.send("llmpool-test-runtime", {"type": "no.such.type"})
            await layer.send("llmpool-test-runtime", {"type": RUNTIME_REQUEST, "op": "reload_settings", "payload": {},
                                                      "request_id": "req-7", "reply_channel": reply})
            assert (await layer.receive_within(reply, 2))["kind"] == REPLY_ACK
            assert (await layer.receive_within(reply, 2))["data"]["message"] == "internal error (request id req-7)"
        assert "'no.such.type' not handled" in caplog.text
        assert not serving.done()
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)


async def _failing_runtime():
    return Failing()
