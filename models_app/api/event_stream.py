"""GET /v1/admin/events: the runtime's lifecycle transitions as Server-Sent Events.

The runtime publishes its admin events to one group (``models_app.host.event_publisher``);
this stream joins the group and forwards the transitions.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from channels.layers import get_channel_layer

from models_app.transport.messages import ADMIN_EVENTS_GROUP, EVENT_LOAD_PROGRESS, EVENT_TRANSITION

TRANSITION_FIELDS = ("model", "from", "to", "at", "reason", "last_error")
# A loaded model changed without a transition (events of their own): its inference state
# (runtime.model.residency), or one of its replicas failed while the others serve on (runtime.model.writer).
MODEL_EVENT_FIELDS = {
    "reconfigured": ("model", "at", "duration_ms", "changed", "reason"),
    "slept": ("model", "at", "duration_ms", "reason"),
    "woke": ("model", "at", "duration_ms", "reason"),
    "replica_failed": ("model", "at", "replica", "reason", "error"),
}
LOAD_PROGRESS_FIELDS = ("model", "load_progress", "at")
SSE_KEEPALIVE_SECONDS = 15.0


async def transition_stream(keepalive: float = SSE_KEEPALIVE_SECONDS, progress: bool = False) -> AsyncIterator[bytes]:
    """Server-Sent Events: one ``transition`` event per lifecycle transition, until the client leaves;
    with ``progress`` also a ``load_progress`` event ({model, load_progress, at}) per progress step.

    The first bytes (a comment) are sent once the subscription is in place, so a
    client that has read them sees every later transition.  A comment every
    ``keepalive`` seconds keeps idle proxies from closing the stream.
    """
    layer = get_channel_layer()
    channel = await layer.new_channel()  # the default prefix, shared with every receiver (see RuntimeClient)
    await layer.group_add(ADMIN_EVENTS_GROUP, channel)
    try:
        yield b": subscribed to llm-pool transitions\n\n"
        while True:
            try:
                async with asyncio.timeout(keepalive):  # not wait_for: it can drop a cancel on 3.11
                    message = await layer.receive(channel)
            except TimeoutError:
                yield b": keepalive\n\n"
                continue
            event = message.get("event") or {}
            if event.get("kind") == EVENT_TRANSITION:
                yield sse_event(EVENT_TRANSITION, {key: event.get(key) for key in TRANSITION_FIELDS})
            elif event.get("kind") in MODEL_EVENT_FIELDS:
                kind = event["kind"]
                yield sse_event(kind, {key: event.get(key) for key in MODEL_EVENT_FIELDS[kind]})
            elif progress and event.get("kind") == EVENT_LOAD_PROGRESS:
                yield sse_event(EVENT_LOAD_PROGRESS, {key: event.get(key) for key in LOAD_PROGRESS_FIELDS})
    finally:
        await layer.group_discard(ADMIN_EVENTS_GROUP, channel)


def sse_event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
