"""GET /v1/models and /v1/models/{id}: the OpenAI model object, built from the AdminModelEntry.

The OpenAI keys (``id``, ``object``, ``created``, ``owned_by``) come first; llm-pool's own
(``runtime_state``, ``backend``, ``capabilities``) sit under their own keys next to them, which
OpenAI clients ignore.  llm-pool keeps no creation time per model: ``created`` is when this API
process started, the same for every model.
"""
from __future__ import annotations

import time

from models_app import selectors
from models_app.conf import service_settings

OWNED_BY = "llm-pool"
STARTED_AT = int(time.time())


def model_object(entry: dict) -> dict:
    return {
        "id": entry["name"],
        "object": "model",
        "created": STARTED_AT,
        "owned_by": OWNED_BY,
        "runtime_state": entry["runtime_state"],
        "backend": entry["resolved_backend"],
        "capabilities": entry["capabilities"],
    }


async def model_list() -> dict:
    """The models ``service.list_models`` says to list: every configured one ("all"), or the loaded."""
    entries = await selectors.models_list()
    if service_settings().list_models == "loaded":
        entries = [entry for entry in entries if entry["runtime_state"] == "loaded"]
    return {"object": "list", "data": [model_object(entry) for entry in entries]}


async def model_get(model_id: str) -> dict:
    """Any configured model, whatever ``list_models`` lists; UnknownModel (404) otherwise."""
    return model_object(await selectors.model_get(model_id))
