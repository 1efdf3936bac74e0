"""Writes on the Django side.

The admin API views and the Django admin pages both call these functions, so
every load, unload and reload goes through one code path to the runtime; the keys API and
``manage.py create_api_key`` store inference keys through ``key_create`` and its siblings, each
of which raises the keys' version in its own transaction (``models_app.api.keys.key_ring``).
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from datetime import date

from channels.layers import get_channel_layer
from django.db import IntegrityError, close_old_connections, transaction
from django.db.models import F
from pydantic import ValidationError

from models_app import placement
from models_app.conf import service_settings
from models_app.key_fields import SECRET_PREFIX, KeyFields, database_id, usage_owner
from models_app.models import CatalogModel, InferenceKey, KeyRingVersion, KeyUsage
from models_app.transport.messages import (
    ADMIN_EVENT_SEND_TIMEOUT_SECONDS,
    ADMIN_EVENTS_GROUP,
    EVENT_CATALOG,
    OP_LOAD,
    OP_RECONFIGURE,
    OP_RELOAD_SETTINGS,
    OP_SLEEP,
    OP_UNLOAD,
    OP_WAKE,
    admin_event_message,
)
from models_app.transport import nodes
from runtime.config import format_validation_error
from runtime.errors import ApiKeyNameTaken, InvalidRequest, UnknownApiKey

logger = logging.getLogger("llmpool.api")


def catalog_sync(models: list[dict], configured: list[str] | None = None) -> None:
    """Make the catalog mirror equal to the runtime's catalog (one row per configured model).

    ``configured``: every model of the settings file, other nodes' too (a node's catalog holds its
    own): their rows stay.  Two nodes syncing the same model at once: the second tries again."""
    try:
        _catalog_sync(models, configured)
    except IntegrityError:
        _catalog_sync(models, configured)


@transaction.atomic
def _catalog_sync(models: list[dict], configured: list[str] | None) -> None:
    names = [model["name"] for model in models]
    CatalogModel.objects.exclude(name__in=[*names, *(configured or ())]).delete()
    for model in models:
        row = CatalogModel.objects.filter(name=model["name"]).first()
        values = {key: model[key] for key in ("backend", "enabled", "definition", "sources")}
        if row is None:
            CatalogModel.objects.create(name=model["name"], **values)
        elif any(getattr(row, key) != value for key, value in values.items()):
            for key, value in values.items():
                setattr(row, key, value)
            row.save()


async def model_load(name: str, body: dict | None, dry_run: bool = False) -> dict:
    """Load a configured model and answer its AdminModelEntry once it is loaded or failed.

    ``body`` is the optional load body (replicas, target_inflight, backend overrides);
    it goes to the runtime as it came, which validates it (once): LoadBodyInvalid (422) for a
    body that fails the schema, UnknownModel (404), InvalidLoadRequest (400),
    ModelStateConflict (409); RuntimeUnavailable (503) when the runtime does not answer.
    """
    payload = {"name": name, "body": body}
    if dry_run:  # the memory plan of this load, acting on nothing (docs/api.md)
        payload["dry_run"] = True
    return await placement.call(OP_LOAD, payload, deadline=service_settings().admin_call_timeout_seconds)


async def model_unload(name: str) -> dict:
    """Gracefully unload a model; answers its AdminModelEntry once it is unloaded (or already was)."""
    return await placement.call(
        OP_UNLOAD, {"name": name}, deadline=service_settings().admin_call_timeout_seconds
    )


async def model_reconfigure(name: str, body: dict | None) -> dict:
    """Change a loaded model's reconfigurable fields without reloading its weights (runtime.model.residency);
    answers its entry with ``reconfigured`` {duration_ms, changed, reason}."""
    return await placement.call(
        OP_RECONFIGURE, {"name": name, "body": body}, deadline=service_settings().admin_call_timeout_seconds
    )


async def model_residency(name: str, op: str) -> dict:
    """Put a loaded model to sleep (``sleep``) or wake it (``wake``); answers its entry."""
    return await placement.call(
        {"sleep": OP_SLEEP, "wake": OP_WAKE}[op], {"name": name}, deadline=service_settings().admin_call_timeout_seconds
    )


async def settings_reload() -> dict:
    """Reread settings.json + local.json; answers the diff and tells live admin pages.

    Raises InvalidSettings (400) or SettingsReloadConflict (409) with the catalog unchanged.
    """
    diff = await placement.call(OP_RELOAD_SETTINGS)  # every node, two-phase (placement.several)
    nodes.REGISTRY.forget_cache()  # the nodes announced their new catalogs before answering
    await _publish_catalog_changed(diff)
    return diff


async def _publish_catalog_changed(diff: dict) -> None:
    """Tell live admin pages that a settings reload changed the catalog (never raises)."""
    message = admin_event_message({"kind": EVENT_CATALOG, **diff})
    try:
        async with asyncio.timeout(ADMIN_EVENT_SEND_TIMEOUT_SECONDS):
            await get_channel_layer().group_send(ADMIN_EVENTS_GROUP, message)
    except Exception:
        logger.warning("could not publish the catalog change", exc_info=True)


def key_create(*, fields: dict) -> tuple[InferenceKey, str]:
    """Store a new inference key (``fields``: checked by ``KeyFields``); (its row, its secret).

    The secret is 256 random bits; only its sha256 is stored, so this is the one time it is seen.
    Raises 409 api_key_name_taken for a name another key (of the database or of settings.json) has."""
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    _refuse_settings_name(fields["name"])
    try:
        with transaction.atomic():
            row = InferenceKey.objects.create(key_sha256=hashlib.sha256(secret.encode()).hexdigest(), **fields)
            _bump_key_version()
    except IntegrityError:
        raise ApiKeyNameTaken(f"an API key is named {fields['name']!r} already", param="name") from None
    return row, secret


def key_update(*, pk: int, changes: dict) -> InferenceKey:
    """Lay ``changes`` (any field of ``KeyFields``) over the key and store it, checked whole;
    raises 404 unknown_api_key, 400 invalid_request (nothing stored), 409 api_key_name_taken."""
    try:
        with transaction.atomic():
            row = InferenceKey.objects.select_for_update().filter(pk=pk).first()
            if row is None:
                raise UnknownApiKey(f"no API key has the id {database_id(pk)!r}")
            current = {name: getattr(row, name) for name in KeyFields.model_fields}
            merged = validated_key_fields({**current, **changes})
            if merged["name"] != row.name:
                _refuse_settings_name(merged["name"])
            for name, value in merged.items():
                setattr(row, name, value)
            row.save()
            _bump_key_version()
    except IntegrityError:
        raise ApiKeyNameTaken(f"an API key is named {changes.get('name')!r} already", param="name") from None
    return row


def key_delete(*, pk: int) -> None:
    """Delete the key; raises 404 unknown_api_key."""
    with transaction.atomic():
        deleted, _ = InferenceKey.objects.filter(pk=pk).delete()
        if not deleted:
            raise UnknownApiKey(f"no API key has the id {database_id(pk)!r}")
        _bump_key_version()


def validated_key_fields(fields: dict) -> dict:
    """``fields`` checked by ``KeyFields``, as stored; raises 400 invalid_request naming the first
    field at fault."""
    try:
        return KeyFields.model_validate(fields).model_dump()
    except ValidationError as exc:
        problems = format_validation_error(exc)
        first = problems[0]["path"].removeprefix("$").lstrip(".").split(".")[0].split("[")[0] or None
        raise InvalidRequest("; ".join(f"{p['path'].removeprefix('$.')}: {p['message']}" for p in problems),
                             param=first) from None


def _refuse_settings_name(name: str) -> None:
    if any(key.name == name for key in service_settings().api_keys):
        raise ApiKeyNameTaken(f"a key of settings.json is named {name!r}", param="name")


def _bump_key_version() -> None:
    """Raise the keys' version (in the caller's transaction): every API process reads the keys again."""
    if not KeyRingVersion.objects.filter(pk=1).update(version=F("version") + 1):
        KeyRingVersion.objects.create(pk=1, version=1)


def key_usage_add(counts: dict[tuple[int | str, str, date], list[int]]) -> None:
    """Add ``counts`` ((quota key, model, day) -> [input tokens, output tokens, requests]) to the
    usage rows, in one transaction; the counts of a database key deleted meanwhile are dropped."""
    close_old_connections()
    with transaction.atomic():
        for (key, model, day), (input_tokens, output_tokens, requests) in sorted(counts.items(), key=str):
            owner = usage_owner(key)
            increments = {"input_tokens": F("input_tokens") + input_tokens,
                          "output_tokens": F("output_tokens") + output_tokens, "requests": F("requests") + requests}
            if KeyUsage.objects.filter(**owner, model=model, day=day).update(**increments):
                continue
            if "key_id" in owner and not InferenceKey.objects.filter(pk=key).exists():
                continue
            try:
                with transaction.atomic():
                    KeyUsage.objects.create(**owner, model=model, day=day, input_tokens=input_tokens,
                                            output_tokens=output_tokens, requests=requests)
            except IntegrityError:  # another API process made the row first
                KeyUsage.objects.filter(**owner, model=model, day=day).update(**increments)



def key_usage_prune(*, before: date) -> int:
    """Delete the usage rows of days before ``before``; how many."""
    close_old_connections()
    deleted, _ = KeyUsage.objects.filter(day__lt=before).delete()
    return deleted
