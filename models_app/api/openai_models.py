"""GET /v1/models and /v1/models/{id}: the OpenAI model object, built from the AdminModelEntry.

The OpenAI keys (``id``, ``object``, ``created``, ``owned_by``) come first; llm-pool's own
(``runtime_state``, ``backend``, ``capabilities``) sit under their own keys next to them, which
OpenAI clients ignore.  llm-pool keeps no creation time per model: ``created`` is when this API
process started, the same for every model.
"""
from __future__ import annotations

import time

from models_app import selectors
from models_app.api.keys import Caller
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


async def model_list(caller: Caller) -> dict:
    """The models ``service.list_models`` says to list (every configured one, "all", or the loaded)
    that the caller's key may use."""
    entries = [entry for entry in await selectors.models_list() if caller.allows(entry["name"])]
    if service_settings().list_models == "loaded":
        entries = [entry for entry in entries if entry["runtime_state"] == "loaded"]
    return {"object": "list", "data": [model_object(entry) for entry in entries]}


async def model_get(model_id: str, caller: Caller) -> dict:
    """Any configured model the caller's key may use (ModelNotAllowed, 403, before the model is
    looked up, so a key learns nothing of the others), whatever ``list_models`` lists;
    UnknownModel (404) otherwise."""
    caller.check_model(model_id)
    return model_object(await selectors.model_get(model_id))
