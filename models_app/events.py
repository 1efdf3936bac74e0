"""Live admin events over the channel layer.

The runtime process (``serve`` embedded, or the split ``runtime`` worker)
publishes every lifecycle transition and every change of a model's counters
to one group; over Redis the API processes receive them too.  The admin
WebSocket consumer forwards all of them to the browser; the Server-Sent
Events stream at GET /v1/admin/events forwards the transitions.

Every group message is ``{"type": "admin.event", "event": {...}}`` where the
event's ``kind`` is one of:

- ``transition``: model, from, to, at (ISO 8601 UTC), last_error (set when
  ``to`` is failed), entry (the model's AdminModelEntry right after it);
- ``counters``: model and its inflight_requests, queue_depth,
  runtime_inflight, loaded_replicas, replicas and fairness, sent when any of
  them changed (sampled every ``COUNTER_INTERVAL_SECONDS``);
- ``catalog``: a settings reload changed the catalog (its diff).
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from datetime import datetime, timezone

from channels.layers import get_channel_layer

from runtime.state import RuntimeState, TransitionEvent
from runtime.views import model_entry

logger = logging.getLogger("llmpool.events")

GROUP = "llmpool-admin-events"
COUNTER_INTERVAL_SECONDS = 0.2
COUNTER_FIELDS = ("inflight_requests", "queue_depth", "runtime_inflight", "loaded_replicas", "replicas", "fairness")
TRANSITION_FIELDS = ("model", "from", "to", "at", "last_error")
SEND_TIMEOUT_SECONDS = 5.0
OUTBOX_LIMIT = 1000
SSE_KEEPALIVE_SECONDS = 15.0


class RuntimeEventPublisher:
    """Watches one ``ModelPool`` and sends its events, in order, to ``GROUP``.

    ``on_transition`` is the pool's listener; it runs inside a model's writer,
    so it only schedules work.  One sender task drains the outbox, which keeps
    the order of events and lets a slow layer never block a model.
    """

    def __init__(self, layer, counter_interval: float = COUNTER_INTERVAL_SECONDS):
        self.layer = layer
        self.counter_interval = counter_interval
        self.pool = None
        self._outbox: asyncio.Queue = asyncio.Queue(maxsize=OUTBOX_LIMIT)
        self._counters: dict[str, dict] = {}
        self._tasks: list[asyncio.Task] = []

    def attach(self, pool) -> None:
        self.pool = pool

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._send_forever(), name="admin-events:send"),
            asyncio.create_task(self._watch_counters(), name="admin-events:counters"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def on_transition(self, event: TransitionEvent) -> None:
        # Publish after the writer's current step, so the entry read is the one the step left.
        asyncio.get_running_loop().call_soon(self._publish_transition, event)

    def _publish_transition(self, event: TransitionEvent) -> None:
        controller = self.pool.controllers.get(event.model) if self.pool is not None else None
        entry = None
        if controller is not None:
            try:
                entry = model_entry(controller)
            except Exception:
                logger.exception("cannot build the entry of %s for its transition event", event.model)
        if entry is not None:
            self._counters[event.model] = _counters(entry)
        last_error = controller.last_error if controller is not None and event.new is RuntimeState.FAILED else None
        self._enqueue(
            {
                "kind": "transition",
                "model": event.model,
                "from": event.old.value,
                "to": event.new.value,
                "at": _iso(event.at),
                "last_error": last_error,
                "entry": entry,
            }
        )

    async def _watch_counters(self) -> None:
        while True:
            await asyncio.sleep(self.counter_interval)
            try:
                self._sample_counters()
            except Exception:
                logger.exception("sampling model counters failed")

    def _sample_counters(self) -> None:
        controllers = dict(self.pool.controllers) if self.pool is not None else {}
        for name in [n for n in self._counters if n not in controllers]:
            del self._counters[name]
        for name, controller in controllers.items():
            counters = _counters(model_entry(controller))
            if self._counters.get(name) != counters:
                first_sight = name not in self._counters
                self._counters[name] = counters
                if not first_sight:
                    self._enqueue({"kind": "counters", "model": name, **counters})

    def _enqueue(self, event: dict) -> None:
        try:
            self._outbox.put_nowait(event)
        except asyncio.QueueFull:
            logger.warning("admin event outbox full; dropping a %s event of %s", event["kind"], event.get("model"))

    async def _send_forever(self) -> None:
        while True:
            event = await self._outbox.get()
            try:
                await asyncio.wait_for(self.layer.group_send(GROUP, _message(event)), SEND_TIMEOUT_SECONDS)
            except Exception:
                logger.warning("could not publish a %s event of %s", event["kind"], event.get("model"), exc_info=True)


async def publish_catalog_changed(diff: dict) -> None:
    """Tell live admin pages that a settings reload changed the catalog (never raises)."""
    event = {"kind": "catalog", **diff}
    try:
        await asyncio.wait_for(get_channel_layer().group_send(GROUP, _message(event)), SEND_TIMEOUT_SECONDS)
    except Exception:
        logger.warning("could not publish the catalog change", exc_info=True)


async def transition_stream(keepalive: float = SSE_KEEPALIVE_SECONDS) -> AsyncIterator[bytes]:
    """Server-Sent Events: one ``transition`` event per lifecycle transition, until the client leaves.

    The first bytes (a comment) are sent once the subscription is in place, so a
    client that has read them sees every later transition.  A comment every
    ``keepalive`` seconds keeps idle proxies from closing the stream.
    """
    layer = get_channel_layer()
    channel = await layer.new_channel()  # the default prefix, shared with every receiver (see RuntimeClient)
    await layer.group_add(GROUP, channel)
    try:
        yield b": subscribed to llm-pool transitions\n\n"
        while True:
            try:
                message = await asyncio.wait_for(layer.receive(channel), keepalive)
            except asyncio.TimeoutError:
                yield b": keepalive\n\n"
                continue
            event = message.get("event") or {}
            if event.get("kind") == "transition":
                yield sse_event("transition", {key: event.get(key) for key in TRANSITION_FIELDS})
    finally:
        await layer.group_discard(GROUP, channel)


def sse_event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _message(event: dict) -> dict:
    return {"type": "admin.event", "event": event}


def _counters(entry: dict) -> dict:
    return {key: entry[key] for key in COUNTER_FIELDS}


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z"
    )
