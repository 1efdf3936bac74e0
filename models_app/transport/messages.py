"""What travels on the channel layer between the API processes and the runtime: the one place
that names its channel, its group, its message types and the kinds of their contents.

A request goes to a node's channel (``RUNTIME_CHANNEL`` embedded, ``llmpool-runtime.<node>`` in the
split: ``models_app.transport.nodes``) as a ``RUNTIME_REQUEST`` naming one ``OP_*`` (one per
``RuntimeService.op_<name>``); the runtime answers on the request's reply channel with
``RUNTIME_REPLY`` messages whose ``kind`` is a ``REPLY_*``.  A ``RUNTIME_CANCEL``
drops a request its caller gave up on.  The runtime publishes admin events to
``ADMIN_EVENTS_GROUP`` as ``ADMIN_EVENT`` messages whose ``event["kind"]`` is one of
``EVENT_TRANSITION``, ``EVENT_COUNTERS``, ``EVENT_LOAD_PROGRESS`` or ``EVENT_CATALOG``; the admin WebSocket adds
``EVENT_SNAPSHOT`` of its own.

Channels dispatches a message to the consumer method named after its type with the dot
replaced (``runtime.request`` to ``runtime_request``, ``admin.event`` to ``admin_event``).
"""
from __future__ import annotations

RUNTIME_CHANNEL = "llmpool-runtime"
ADMIN_EVENTS_GROUP = "llmpool-admin-events"

# Message types.
RUNTIME_REQUEST = "runtime.request"
RUNTIME_CANCEL = "runtime.cancel"
RUNTIME_REPLY = "runtime.reply"
ADMIN_EVENT = "admin.event"

# The operations a runtime request names.
OP_LIST_MODELS = "list_models"
OP_GET_MODEL = "get_model"
OP_LOAD = "load"
OP_UNLOAD = "unload"
OP_RELOAD_SETTINGS = "reload_settings"
# A reload over several nodes, two-phase (models_app.placement.several): check and hold, then swap or let go.
OP_RELOAD_PREPARE = "reload_prepare"
OP_RELOAD_COMMIT = "reload_commit"
OP_RELOAD_ABORT = "reload_abort"
OP_GPU_MEMORY = "gpu_memory"
OP_CATALOG = "catalog"
OP_GENERATE = "generate"
OP_EMBED = "embed"
OP_TRANSCRIBE = "transcribe"  # speech to text (runtime.inference.transcription)
OP_RERANK = "rerank"  # one score per document (runtime.inference.rerank)
OP_COUNT_TOKENS = "count_tokens"  # a generate payload's prompt tokens (runtime.inference.token_count)
OP_METRICS = "metrics"  # the runtime's Prometheus text (GET /metrics)
OP_ACTIVITY = "activity"  # the ring of finished requests (GET /v1/admin/activity)
OP_MODEL_LOGS = "model_logs"  # a model's server / engine process output (GET .../logs)
OP_RECONFIGURE = "reconfigure"  # change a loaded model's inference state (runtime.model.residency)
OP_SLEEP = "sleep"
OP_WAKE = "wake"

# The kinds of a runtime reply: ``ack`` and ``heartbeat`` only keep the exchange alive; a
# ``chunk`` is streamed data; ``result`` and ``error`` end the exchange.
REPLY_ACK = "ack"
REPLY_HEARTBEAT = "heartbeat"
REPLY_CHUNK = "chunk"
REPLY_RESULT = "result"
REPLY_ERROR = "error"

# The kinds of an admin event (see ``models_app.host.event_publisher``), and the WebSocket's own.
EVENT_TRANSITION = "transition"
EVENT_COUNTERS = "counters"
EVENT_CATALOG = "catalog"
EVENT_LOAD_PROGRESS = "load_progress"
EVENT_SNAPSHOT = "snapshot"

# Admin events are best effort: a publisher waits this long for the layer to take one, then drops it.
ADMIN_EVENT_SEND_TIMEOUT_SECONDS = 5.0


def admin_event_message(event: dict) -> dict:
    """The group message that carries one admin event."""
    return {"type": ADMIN_EVENT, "event": event}
