"""Ollama's model listings, built from the runtime's admin entries (as /v1/models is).

- ``/api/version``: ``OLLAMA_VERSION``, the Ollama release whose API this follows (VS Code
  Copilot wants 0.6.4 at least);
- ``/api/tags``: every model (and alias) the caller's key may use, as ``/v1/models`` lists
  them: ``name`` and ``model`` the client-facing name, ``modified_at`` when this API process
  started (llm-pool keeps no time per model), ``size`` the model file's bytes (else the
  memory estimate), ``digest`` a SHA-256 of the model's definition (it changes when the
  definition does), ``details`` from the GGUF header where there is one (``family`` its
  architecture, ``parameter_size`` its size label, ``quantization_level`` its file type),
  else the backend's name;
- ``/api/show``: ``details``, ``capabilities`` (``completion``; ``tools``, ``thinking``,
  ``vision``, ``embedding`` from the model's capabilities), ``model_info`` with
  ``general.architecture``, ``general.basename`` (the name asked for, which Copilot shows) and
  ``<architecture>.context_length`` (where the context is known), ``parameters`` (``num_ctx``);
- ``/api/ps``: the loaded models with ``size`` (the memory they are charged), ``size_vram``
  (its share on GPUs), ``context_length`` and ``expires_at`` (when their ``ttl_seconds``
  unloads them idle; a model without one never expires: 9999-12-31).
"""
from __future__ import annotations

import hashlib
import time
from datetime import datetime, timezone

from models_app import selectors
from models_app.api.keys import Caller
from models_app.api.openai_models import STARTED_AT, model_ids, once_per_model
from models_app.transport import nodes
from runtime.json_codec import dumps
from runtime.pool.catalog import base_of

OLLAMA_VERSION = "0.12.6"
MIB = 1024 * 1024
NEVER = "9999-12-31T23:59:59Z"
MODIFIED_AT = datetime.fromtimestamp(STARTED_AT, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def version() -> dict:
    return {"version": OLLAMA_VERSION}


async def tags(caller: Caller) -> dict:
    entries = once_per_model(await selectors.models_list())
    names = await nodes.REGISTRY.model_names()
    return {"models": [
        _listed(entry, name, meant)
        for entry in entries
        for name, meant in model_ids(entry)
        if caller.allows(meant, names)
    ]}


async def show(model: str, caller: Caller) -> dict:
    """``/api/show`` of ``model`` (a name or an alias); 403 model_not_allowed, 404 unknown_model."""
    base, _ = base_of(await caller.resolve(model), await nodes.REGISTRY.adapter_bases())
    entry = await selectors.model_get(base)
    architecture = _architecture(entry)
    # Copilot shows general.basename as the model's name in its picker: the name the client asked for.
    info = {"general.architecture": architecture, "general.basename": model}
    context = entry.get("context_length")
    if context is not None:
        info[f"{architecture}.context_length"] = context
    return {
        "modelfile": "",
        "parameters": f"num_ctx {context}" if context is not None else "",
        "template": "",
        "details": _details(entry),
        "model_info": info,
        "capabilities": _capabilities(entry["capabilities"]),
        "modified_at": MODIFIED_AT,
    }


async def ps(caller: Caller) -> dict:
    entries = [entry for entry in once_per_model(await selectors.models_list()) if entry["runtime_state"] == "loaded"]
    names = await nodes.REGISTRY.model_names()
    models = []
    for entry in entries:
        if not caller.allows(entry["name"], names):
            continue
        charged = (entry.get("memory") or {}).get("charge_mib") or {}
        listed = _listed(entry, entry["name"])
        del listed["modified_at"]  # not a field of Ollama's running models
        models.append({
            **listed,
            "expires_at": _expires_at(entry),
            "size_vram": sum(mib for device, mib in charged.items() if device != "cpu") * MIB,
            "context_length": entry.get("context_length"),
        })
        if charged:
            models[-1]["size"] = sum(charged.values()) * MIB
    return {"models": models}


def _listed(entry: dict, name: str, meant: str | None = None) -> dict:
    """``entry`` listed as ``name``, which means ``meant`` (the model, or one of its adapters:
    ``details.parent_model`` is then the base)."""
    details = _details(entry)
    if meant not in (None, entry["name"]):
        details["parent_model"] = entry["name"]
    return {
        "name": name,
        "model": name,
        "modified_at": MODIFIED_AT,
        "size": _file(entry).get("size_bytes") or (entry.get("vram_estimate_mib") or 0) * MIB,
        "digest": hashlib.sha256(dumps(entry["definition"])).hexdigest(),
        "details": details,
    }


def _file(entry: dict) -> dict:
    return entry.get("model_file") or {}


def _architecture(entry: dict) -> str:
    return _file(entry).get("architecture") or entry["resolved_backend"]


def _details(entry: dict) -> dict:
    file = _file(entry)
    family = _architecture(entry)
    return {
        "parent_model": "",
        "format": file.get("format") or entry["resolved_backend"],
        "family": family,
        "families": [family],
        "parameter_size": file.get("size_label") or "",
        "quantization_level": file.get("quantization") or "",
    }


def _capabilities(capabilities: dict) -> list[str]:
    named = ["completion"]
    if capabilities["tools"]:
        named.append("tools")
    if "enabled" in capabilities["thinking_modes"]:
        named.append("thinking")
    if "image" in capabilities["modalities"]:
        named.append("vision")
    if capabilities["embeddings"]:
        named.append("embedding")
    return named


def _expires_at(entry: dict) -> str:
    if entry.get("idle_expires_at"):
        return entry["idle_expires_at"]
    keep_alive = entry.get("keep_alive_seconds")
    ttl = entry["definition"].get("ttl_seconds") if keep_alive is None else keep_alive
    if ttl is None or ttl < 0 or entry["definition"].get("pinned"):
        return NEVER
    # Busy now: its idle countdown starts when its last request ends.
    return datetime.fromtimestamp(time.time() + ttl, tz=timezone.utc).isoformat().replace("+00:00", "Z")
