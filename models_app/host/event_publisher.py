"""The runtime's side of the live admin events: it publishes them over the channel layer.

The runtime process (``serve`` embedded, or the split ``runtime`` worker)
publishes every lifecycle transition and every change of a model's counters
to ``ADMIN_EVENTS_GROUP``; over Redis the API processes receive them too.  The
admin WebSocket consumer (``models_app.workbench.consumers``) forwards all of
them to the browser; the Server-Sent Events stream at GET /v1/admin/events
(``models_app.api.event_stream``) forwards the transitions.

Every group message is ``{"type": "admin.event", "event": {...}}`` where the
event's ``kind`` is one of (``models_app.transport.messages`` names them):

- ``transition``: model, from, to, at (ISO 8601 UTC), reason (why: admin, startup,
  request, ttl, group_swap, keep_warm, engine_failure; see ``runtime.model.state``),
  last_error (set when ``to`` is failed), entry (the model's AdminModelEntry right after it);
- ``counters``: model and its inflight_requests, queue_depth,
  runtime_inflight, loaded_replicas, replicas and fairness, sent when any of
  them changed (sampled every ``COUNTER_INTERVAL_SECONDS``);
- ``load_progress``: model, load_progress ({stage, fraction}, see ``runtime.model.load_progress``)
  and at, sent when a loading model's progress changed (sampled with the counters);
- ``catalog``: a settings reload changed the catalog (its diff);
- ``reconfigured``, ``slept``, ``woke`` (runtime.model.residency): model, at, duration_ms, reason,
  changed (reconfigured: {field: {from, to}}), entry; the model stayed loaded;
- ``replica_failed`` (runtime.model.writer): model, at, replica (1-based), reason, error, entry; the
  model stayed loaded on its other replicas.
"""
from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timezone

from models_app.host.tasks import cancel_and_wait
from models_app.transport.messages import (
    ADMIN_EVENT_SEND_TIMEOUT_SECONDS,
    ADMIN_EVENTS_GROUP,
    EVENT_COUNTERS,
    EVENT_LOAD_PROGRESS,
    EVENT_TRANSITION,
    admin_event_message,
)
from runtime.model.state import RuntimeState, TransitionEvent
from runtime.observe.read_models import model_entry
from runtime.model.residency import ModelEvent

logger = logging.getLogger("llmpool.events")

COUNTER_INTERVAL_SECONDS = 0.2
COUNTER_FIELDS = ("inflight_requests", "queue_depth", "runtime_inflight", "loaded_replicas", "replicas", "fairness")
OUTBOX_LIMIT = 1000


class RuntimeEventPublisher:
    """Watches one ``ModelPool`` and sends its events, in order, to ``ADMIN_EVENTS_GROUP``.

    ``on_transition`` is the pool's listener; it runs inside a model's writer,
    so it only schedules work.  One sender task drains the outbox, which keeps
    the order of events and lets a slow layer never block a model.
    """

    def __init__(self, layer, counter_interval: float = COUNTER_INTERVAL_SECONDS):
        self.layer = layer
        self.counter_interval = counter_interval
        self.pool = None
        self.entry = model_entry  # how a model's entry is read (the service's, with its stats, once attached)
        self._outbox: asyncio.Queue = asyncio.Queue(maxsize=OUTBOX_LIMIT)
        self._counters: dict[str, dict] = {}
        self._progress: dict[str, dict | None] = {}  # the load_progress last sent per model
        self._tasks: list[asyncio.Task] = []

    def attach(self, pool, entry=None) -> None:
        """Watch ``pool``; ``entry(controller)`` reads the AdminModelEntry the events carry (the
        runtime service's, so an event's entry is the one the admin API answers)."""
        self.pool = pool
        if entry is not None:
            self.entry = entry

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._send_forever(), name="admin-events:send"),
            asyncio.create_task(self._watch_counters(), name="admin-events:counters"),
        ]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(tasks)

    def on_transition(self, event: TransitionEvent) -> None:
        # Publish after the writer's current step, so the entry read is the one the step left.
        if isinstance(event, ModelEvent):
            asyncio.get_running_loop().call_soon(self._publish_model_event, event)
            return
        asyncio.get_running_loop().call_soon(self._publish_transition, event)

    def _publish_model_event(self, event: ModelEvent) -> None:
        controller = self.pool.controllers.get(event.model) if self.pool is not None else None
        entry = self.entry(controller) if controller is not None else None
        self._enqueue({"kind": event.kind, "model": event.model, "at": _iso(event.at), **event.details, "entry": entry})

    def _publish_transition(self, event: TransitionEvent) -> None:
        controller = self.pool.controllers.get(event.model) if self.pool is not None else None
        entry = None
        if controller is not None:
            try:
                entry = self.entry(controller)
            except Exception:
                logger.exception("cannot build the entry of %s for its transition event", event.model)
        if entry is not None:
            self._counters[event.model] = _counters(entry)
        last_error = controller.last_error if controller is not None and event.new is RuntimeState.FAILED else None
        self._enqueue(
            {
                "kind": EVENT_TRANSITION,
                "model": event.model,
                "from": event.old.value,
                "to": event.new.value,
                "at": _iso(event.at),
                "reason": event.reason,
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
        for name in [n for n in self._progress if n not in controllers]:
            del self._progress[name]
        for name, controller in controllers.items():
            entry = model_entry(controller)
            self._sample_progress(name, entry)
            counters = _counters(entry)
            if self._counters.get(name) != counters:
                first_sight = name not in self._counters
                self._counters[name] = counters
                if not first_sight:
                    self._enqueue({"kind": EVENT_COUNTERS, "model": name, **counters})

    def _sample_progress(self, name: str, entry: dict) -> None:
        progress = entry.get("load_progress")
        if progress is not None and progress != self._progress.get(name):
            self._enqueue({"kind": EVENT_LOAD_PROGRESS, "model": name, "load_progress": progress,
                           "at": _iso(time.time())})
        self._progress[name] = progress

    def _enqueue(self, event: dict) -> None:
        try:
            self._outbox.put_nowait(event)
        except asyncio.QueueFull:
            logger.warning("admin event outbox full; dropping a %s event of %s", event["kind"], event.get("model"))

    async def _send_forever(self) -> None:
        while True:
            event = await self._outbox.get()
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for drops a cancel that comes as
                # the send completes, and stop() then waited for this loop forever (a CI hang)
                async with asyncio.timeout(ADMIN_EVENT_SEND_TIMEOUT_SECONDS):
                    await self.layer.group_send(ADMIN_EVENTS_GROUP, admin_event_message(event))
            except Exception:
                logger.warning("could not publish a %s event of %s", event["kind"], event.get("model"), exc_info=True)


def _counters(entry: dict) -> dict:
    return {key: entry[key] for key in COUNTER_FIELDS}


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z"
    )
