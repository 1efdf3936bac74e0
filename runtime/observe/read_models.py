"""Read models of the pool: snapshots in the exact shapes of the admin API contract."""
from __future__ import annotations

from datetime import datetime, timezone

from runtime.model.controller import ModelController
from runtime.model.state import RuntimeState
from runtime.pool.model_card import context_length, model_file


def model_entry(controller: ModelController) -> dict:
    """One AdminModelEntry (GET /v1/admin/models item, load / unload answer)."""
    entry = controller.entry
    definition, spec = entry.definition, entry.spec
    scheduler = controller.scheduler
    state = controller.state
    vram_mib, vram_replicas, vram_source = controller.vram_estimate()
    return {
        "name": entry.name,
        "resolved_backend": definition.backend,
        "configured_enabled": definition.enabled,
        "runtime_state": state.value,
        "is_loaded": state is RuntimeState.LOADED,
        "replicas": controller.replicas,
        "replica_max": definition.replica_max,
        "loaded_replicas": len(controller.serving_engines),
        "inflight_requests": scheduler.queue_depth + scheduler.inflight,
        "queue_depth": scheduler.queue_depth,
        "runtime_inflight": scheduler.inflight,
        "configured_target_inflight": controller.configured_target_inflight,
        "effective_target_inflight": controller.effective_target_inflight,
        "fairness": {
            "rejected_per_key_limit": scheduler.rejected_per_key_limit,
            "rejected_executor_limit": scheduler.rejected_executor_limit,
            "keys": scheduler.key_report(),
        },
        "last_error": controller.last_error,
        "vram_estimate_mib": vram_mib,
        "vram_estimate_replica_count": vram_replicas,
        "vram_estimate_source": vram_source,
        "load_constraints": spec.load_constraints(definition),
        "load_recommendations": spec.load_recommendations(definition),
        "load_override": dict(controller.load_override),
        "capabilities": spec.capabilities(definition),
        # What clients size prompts by, and a local GGUF file's own description (runtime.pool.model_card).
        "context_length": context_length(entry, controller.load_override),
        "model_file": model_file(entry),
        "definition": entry.definition_dict(),
        # Switching by itself (docs/api.md): the definition carries
        # load_on_request, ttl_seconds, pinned, keep_warm, aliases and load_wait_timeout_seconds.
        "group": controller.group.name if controller.group is not None else None,
        "idle_expires_at": iso_time(controller.idle_expires_at),
        # A request's keep_alive (Ollama's, with service.ollama_keep_alive): the TTL until the model unloads.
        "keep_alive_seconds": controller.keep_alive,
        "last_request_at": iso_time(controller.clock.last_request_at),
        "waiting_requests": len(controller.waiters),
        "last_reason": controller.reason,
        # Memory-aware placement (docs/api.md): the devices of the current or last load,
        # and the next load's estimate with the charge held now (runtime.pool.memory).
        "placement": controller.placement,
        "memory": controller.memory_view(),
        # Load progress (docs/observability.md): {stage, fraction} while loading, else null.
        "load_progress": controller.load_progress if state is RuntimeState.LOADING else None,
        # The warm tier (docs/api.md, runtime.model.residency): "active" or "sleeping".
        "residency": controller.residency,
        # Whether its backend can sleep (docs/api.md): POST .../sleep is not 400 not_sleepable.
        "sleepable": spec.can_sleep(definition),
    }


def iso_time(timestamp: float | None) -> str | None:
    """Epoch seconds as ISO 8601 UTC with milliseconds (the event stream's ``at``), or None."""
    if timestamp is None:
        return None
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def gpu_model_entry(controller: ModelController) -> dict:
    vram_mib, vram_replicas, vram_source = controller.vram_estimate()
    return {
        "name": controller.name,
        "runtime_state": controller.state.value,
        "is_loaded": controller.state is RuntimeState.LOADED,
        "configured_target_inflight": controller.configured_target_inflight,
        "effective_target_inflight": controller.effective_target_inflight,
        "vram_estimate_mib": vram_mib,
        "vram_estimate_replica_count": vram_replicas,
        "vram_estimate_source": vram_source,
    }
