"""A model's process output (GET /v1/admin/models/{name}/logs): the supervisor's ring of each
loaded replica's managed server or engine process (runtime.supervisor.output).

Only loaded replicas have a ring; after an unload the output is in the log files the
supervisor keeps (docs/observability.md).  No request text is written there by llm-pool.
"""
from __future__ import annotations

from runtime.observe.params import count_param
from runtime.supervisor.output import RING_LINES

DEFAULT_LINES = 100


def model_logs(pool, payload: dict) -> dict:
    """``{"model", "replicas": [{"replica", "kind", "running", "lines", "next"}]}``.

    ``lines``: how many of the newest lines (1 to RING_LINES, default 100; else 400
    invalid_request); ``after``: ``{replica: number}`` from an earlier answer's ``next``, to get
    only the lines since (a follow).  An unknown model is 404 unknown_model.
    """
    controller = pool.lookup(payload["name"])
    count = _lines(payload.get("lines"))
    after = payload.get("after") or {}
    replicas = []
    for replica, engine in enumerate(list(controller.engines)):
        process = getattr(engine, "process", None)
        if process is None:
            continue
        since = after.get(str(replica))
        lines, written = process.output_since(None if since is None else int(since), count)
        replicas.append({
            "replica": replica,
            "kind": "engine_process" if hasattr(engine, "stats") else "managed_server",
            "running": process.running,
            "lines": lines,
            "next": written,
        })
    return {"model": controller.name, "replicas": replicas}


def _lines(value) -> int:
    return DEFAULT_LINES if value is None else count_param(value, upper=RING_LINES, param="lines")
