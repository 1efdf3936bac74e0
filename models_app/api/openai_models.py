"""GET /v1/models and /v1/models/{id}: the OpenAI model object, built from the AdminModelEntry.

The OpenAI keys (``id``, ``object``, ``created``, ``owned_by``) come first; llm-pool's own
(``runtime_state``, ``backend``, ``capabilities``, ``context_length``: the tokens one request may
use, null where unknown) sit under their own keys next to them, which OpenAI clients ignore.  llm-pool keeps no creation time per model: ``created`` is when this API
process started, the same for every model.  A model's aliases (``aliases`` in its definition)
are listed as models of their own (but a pattern alias, ``claude-*``, is no model id), each with
``alias_of`` naming the model it resolves to; the object of a model that has aliases lists them
(``aliases``).  A model's LoRA adapters are models of their own too: ``<model>:<adapter>`` and
each adapter's aliases, with ``parent`` naming the base model they run on (vLLM's shape) and
``alias_of`` on an adapter's alias; a key sees an adapter when it may use the adapter's id (a
key that lists only the base does not).  ``node`` names the node
that serves it; a model several nodes serve is listed once, from a node where it is loaded if any.
"""
from __future__ import annotations

import time

from models_app import selectors
from models_app.api.keys import Caller
from models_app.conf import service_settings
from models_app.transport import nodes
from runtime.backends.shared.adapters import adapter_id
from runtime.pool.catalog import base_of, is_pattern

OWNED_BY = "llm-pool"
STARTED_AT = int(time.time())


def model_object(entry: dict, model_id: str | None = None, meant: str | None = None) -> dict:
    """The model object of ``entry`` under its name, or under another id (``model_id``) that
    means ``meant``: the model itself (an alias) or one of its adapters (``model_ids``)."""
    model_id = model_id or entry["name"]
    meant = meant or entry["name"]
    if meant != entry["name"]:
        names = {"parent": entry["name"], **({"alias_of": meant} if model_id != meant else {})}
    elif model_id != entry["name"]:
        names = {"alias_of": entry["name"]}
    else:
        names = {"aliases": _aliases(entry)} if _aliases(entry) else {}
    return {
        "id": model_id,
        "object": "model",
        "created": STARTED_AT,
        "owned_by": OWNED_BY,
        "runtime_state": entry["runtime_state"],
        "backend": entry["resolved_backend"],
        "capabilities": entry["capabilities"],
        "context_length": entry.get("context_length"),
        **names,
        **({"node": entry["node"]} if "node" in entry else {}),
    }


def _aliases(entry: dict) -> list[str]:
    return list(entry["definition"].get("aliases") or [])


def model_ids(entry: dict) -> list[tuple[str, str]]:
    """Each id ``entry`` is listed under and the model id it means: the model's name and its
    aliases (not the patterns), each adapter's id (``<model>:<adapter>``) and its aliases."""
    name = entry["name"]
    ids = [(name, name)] + [(alias, name) for alias in _aliases(entry) if not is_pattern(alias)]
    for adapter, declared in (entry["definition"].get("adapters") or {}).items():
        meant = adapter_id(name, adapter)
        ids += [(meant, meant)] + [(alias, meant) for alias in declared.get("aliases") or ()]
    return ids


def once_per_model(entries: list[dict]) -> list[dict]:
    """One entry per model: a model that several nodes serve by its loaded node's entry, else the first."""
    chosen: dict[str, dict] = {}
    for entry in entries:
        kept = chosen.get(entry["name"])
        if kept is None or (kept["runtime_state"] != "loaded" and entry["runtime_state"] == "loaded"):
            chosen[entry["name"]] = entry
    return list(chosen.values())


async def model_list(caller: Caller) -> dict:
    """The models ``service.list_models`` says to list (every configured one, "all", or the loaded)
    that the caller's key may use."""
    entries = once_per_model(await selectors.models_list())
    if service_settings().list_models == "loaded":
        entries = [entry for entry in entries if entry["runtime_state"] == "loaded"]
    names = await nodes.REGISTRY.model_names()
    data = [
        model_object(entry, model_id, meant)
        for entry in entries
        for model_id, meant in model_ids(entry)
        if caller.allows(meant, names)
    ]
    return {"object": "list", "data": data}


async def model_get(model_id: str, caller: Caller) -> dict:
    """Any configured model (or alias) the caller's key may use (ModelNotAllowed, 403, before the model is
    looked up, so a key learns nothing of the others), whatever ``list_models`` lists;
    UnknownModel (404) otherwise."""
    model = await caller.resolve(model_id)
    base, _ = base_of(model, await nodes.REGISTRY.adapter_bases())
    return model_object(await selectors.model_get(base), model_id, model)
