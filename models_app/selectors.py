"""Reads on the Django side: the catalog mirror and the runtime's live views."""
from __future__ import annotations

from datetime import date
from typing import Any

from django.db import close_old_connections
from django.db.models import Sum
from django.db.models.functions import Coalesce

from models_app import placement
from models_app.key_fields import usage_owner
from runtime.key_terms import LIMIT_NAMES
from models_app.models import CatalogModel, InferenceKey, KeyRingVersion, KeyUsage
from models_app.transport.messages import OP_ACTIVITY, OP_GET_MODEL, OP_GPU_MEMORY, OP_LIST_MODELS

MIB = 1024 * 1024


def catalog_get(name: str) -> CatalogModel | None:
    return CatalogModel.objects.filter(name=name).first()


async def models_list() -> list[dict]:
    """Every configured model's AdminModelEntry (GET /v1/admin/models)."""
    return (await models_answer())["models"]


async def models_answer() -> dict:
    """GET /v1/admin/models's answer: ``models``, and with several nodes ``nodes``."""
    return await placement.call(OP_LIST_MODELS)


async def model_get(name: str) -> dict:
    """One model's AdminModelEntry; raises UnknownModel (404)."""
    return await placement.call(OP_GET_MODEL, {"name": name})


async def gpu_memory() -> dict:
    """GPU memory usage and per-model VRAM estimates (GET /v1/admin/gpu-memory)."""
    return await placement.call(OP_GPU_MEMORY)


def effective_values(entry: dict) -> list[dict[str, Any]]:
    """The effective loaded value of every definition and override key, per the spec's merge rule.

    A key present in ``load_override`` wins even when its value is null; otherwise the
    definition's value holds.  ``replicas`` is the exception: a load's replica count is not
    part of the override, and the entry's own ``replicas`` is the current effective count.
    ``meaning`` explains a value that is not literal (a null that means a default, a bit pair).
    """
    definition, override = entry["definition"], entry["load_override"]
    constraints = entry["load_constraints"]
    rows = []
    for key in [*definition, *(k for k in override if k not in definition)]:
        overridden = key in override
        effective = override[key] if overridden else definition.get(key)
        if key == "replicas":
            effective = entry["replicas"]
        constraint = constraints.get(key, {})
        rows.append(
            {
                "key": key,
                "configured": definition.get(key),
                "configured_present": key in definition,
                "overridden": overridden,
                "override": override.get(key),
                "effective": effective,
                "meaning": _meaning(key, effective, constraint),
            }
        )
    return rows


def _meaning(key: str, value: Any, constraint: dict) -> str | None:
    """How the runtime reads a value whose meaning is not literal (null defaults, cache bit pairs)."""
    if key == "exllama_cache_quant":
        if value is None:
            return "fp16 cache"
        k_bits, _, v_bits = str(value).partition(",")
        return f"k={k_bits} bits, v={v_bits or k_bits} bits"
    if isinstance(value, int) and constraint.get("display_unit") == "mib":
        return f"{value / MIB:g} MiB"
    if value is None:
        if constraint.get("null_means"):
            return constraint["null_means"]
        if constraint.get("default") is not None:
            return f"runtime default: {constraint['default']}"
    return None


async def activity(*, model: str | None = None, limit: str | None = None) -> dict:
    """The runtime's ring of finished requests (GET /v1/admin/activity); the runtime checks both."""
    query = {key: value for key, value in (("model", model), ("limit", limit)) if value is not None}
    return await placement.call(OP_ACTIVITY, query)


def key_ring_version() -> int:
    """The version of the inference keys in the database (``KeyRingVersion``); 0 before any change."""
    return KeyRingVersion.objects.filter(pk=1).values_list("version", flat=True).first() or 0


def key_ring_rows(known_version: int | None) -> tuple[int, list[dict] | None]:
    """(the keys' version, every key row as the key ring needs it), or (the version, None) when it
    is ``known_version``: the usual answer, one single-row query.  The version is read first, so
    rows newer than it only make the next check read them again."""
    close_old_connections()  # a long-lived API process: drop a connection the database closed
    version = key_ring_version()
    if version == known_version:
        return version, None
    fields = ("id", "name", "key_sha256", "models", "fairness_key", "disabled", "priority", "queue_timeout_seconds",
              "weight", *LIMIT_NAMES)
    return version, list(InferenceKey.objects.values(*fields))


def key_list() -> list[InferenceKey]:
    return list(InferenceKey.objects.all())


def key_get(pk: int) -> InferenceKey | None:
    return InferenceKey.objects.filter(pk=pk).first()


def key_tokens_between(key: int | str, first: date, last: date) -> int:
    """The tokens (input and output) the usage rows of the key of the quota key ``key`` count from
    ``first`` to ``last``, both included."""
    close_old_connections()
    totals = KeyUsage.objects.filter(**usage_owner(key), day__gte=first, day__lte=last).aggregate(
        input=Sum("input_tokens"), output=Sum("output_tokens"))
    return (totals["input"] or 0) + (totals["output"] or 0)


def key_usage(key: int | str, since: date) -> list[KeyUsage]:
    """The usage rows of the key of the quota key ``key`` from ``since`` on, by day then model."""
    close_old_connections()
    return list(KeyUsage.objects.filter(**usage_owner(key), day__gte=since))


def key_token_totals() -> list[dict]:
    """Every key's tokens per model over the rows kept: ``name`` (the key's, of the database or of
    settings.json), ``model``, ``input``, ``output``."""
    close_old_connections()
    return list(KeyUsage.objects.values("model", name=Coalesce("key__name", "settings_key")).annotate(
        input=Sum("input_tokens"), output=Sum("output_tokens")).order_by("name", "model"))
