"""The keys API (/v1/admin/keys, additive to the contract): inference keys created, listed,
changed, disabled and deleted while the service runs, guarded by the admin token (and refused, 403 admin_token_required, while none is set).

Keys of the database have ids ``key_<n>``; the keys of settings.json are listed too, read-only,
with ids ``settings:<name>`` (PATCH or DELETE: 409 api_key_read_only; the file is their source).
No answer carries a secret but the one of POST, which shows the new key's secret that once.
A write calls ``keys.forget`` so this process uses it at once; the others read it within
``keys.CHECK_SECONDS`` (``keys.key_ring``)."""
from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

from asgiref.sync import sync_to_async
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response

from models_app import selectors, services
from models_app.api import keys
from models_app.api.auth import AdminTokenConfigured, AdminTokenPermission
from models_app.api.openapi import request_schema
from models_app.api.views import ERROR, AdminApi
from models_app.conf import service_settings
from models_app.quotas.policy import BudgetPeriod
from models_app.quotas.usage import KEEP_DAYS
from models_app.key_fields import (
    DATABASE_ID_PREFIX,
    SETTINGS_ID_PREFIX,
    KeyFields,
    database_id,
    row_json,
    settings_key_json,
)
from runtime.config import MODEL_NAME
from runtime.errors import ApiKeyReadOnly, InvalidRequest, UnknownApiKey

KEY_ID = OpenApiParameter("key_id", str, OpenApiParameter.PATH, description="key_<n>, or settings:<name>")
USAGE_DAYS = OpenApiParameter(
    "days", {"type": "integer", "minimum": 1, "maximum": KEEP_DAYS}, OpenApiParameter.QUERY,
    description=f"how many UTC days back, today included (1 to {KEEP_DAYS}; default 30)",
)
FIELDS = ", ".join(KeyFields.model_fields)


def body_schema(*, create: bool) -> dict:
    """The OpenAPI schema of a create body (``name`` required) or a PATCH body (nothing required),
    from ``KeyFields``; ``models`` as its validator checks it.  The one rule a schema cannot
    state: token_budget and budget_period go together."""
    schema = request_schema(KeyFields)
    schema["properties"]["models"] = {"oneOf": [
        {"type": "string", "enum": ["*"]},
        {"type": "array", "minItems": 1, "items": {"type": "string", "pattern": MODEL_NAME.pattern}},
    ]}
    if not create:
        schema.pop("required", None)
    return schema


class BodyRequired(AutoSchema):
    """A POST's body is required (drf-spectacular marks a body given as a schema optional)."""

    def _get_request_body(self, direction="request"):
        body = super()._get_request_body(direction)
        if body is not None and self.method == "POST":
            body["required"] = True
        return body


def body_object(request) -> dict:
    """The request's JSON object body; anything else is 400 invalid_request."""
    data = request.data  # a body that is not JSON within the limits: 400 invalid_request (BodyRefused)
    if not isinstance(data, dict):
        raise InvalidRequest(f"the body must be a JSON object of the key's fields ({FIELDS})")
    return data


def _settings_key(key_id: str):
    name = key_id.removeprefix(SETTINGS_ID_PREFIX)
    key = next((key for key in service_settings().api_keys if key.name == name), None)
    if key is None:
        raise UnknownApiKey(f"no API key has the id {key_id!r}")
    return key


def _database_pk(key_id: str) -> int:
    number = key_id.removeprefix(DATABASE_ID_PREFIX)
    if not key_id.startswith(DATABASE_ID_PREFIX) or not number.isascii() or not number.isdigit() or len(number) > 18:
        raise UnknownApiKey(f"no API key has the id {key_id!r}")
    return int(number)


class KeysAdminApi(AdminApi):
    permission_classes = [AdminTokenPermission, AdminTokenConfigured]


class KeyListApi(KeysAdminApi):
    schema = BodyRequired()

    @extend_schema(
        summary="List the inference keys (docs/api.md \"Inference keys managed live\")",
        description="Every key: those of settings.json (source settings, read-only) then those of the database "
        "(source api). Never a secret.",
        responses={200: OpenApiTypes.OBJECT, 401: ERROR, 403: ERROR},
    )
    async def get(self, request):
        rows = await sync_to_async(selectors.key_list)()
        listed = [settings_key_json(key) for key in service_settings().api_keys] + [row_json(row) for row in rows]
        return Response({"keys": listed})

    @extend_schema(
        summary="Create an inference key",
        description=f"Body: {FIELDS} (all but name optional; a limit is an integer of at least 1, or null for none; "
        "enforced on the inference paths that run a model, docs/api.md \"Limits per key\"; priority is the class the key's requests queue in). 201 with the key's "
        "fields, its id and its secret `key`, shown this once. 400 invalid_request (nothing stored), 409 "
        "api_key_name_taken.",
        request={"application/json": body_schema(create=True)},
        responses={201: OpenApiTypes.OBJECT, 400: ERROR, 401: ERROR, 403: ERROR, 409: ERROR},
    )
    async def post(self, request):
        fields = services.validated_key_fields(body_object(request))
        row, secret = await sync_to_async(services.key_create)(fields=fields)
        keys.forget()
        return Response({**row_json(row), "key": secret}, status=201)


class KeyDetailApi(KeysAdminApi):
    @extend_schema(
        summary="One inference key", parameters=[KEY_ID],
        responses={200: OpenApiTypes.OBJECT, 401: ERROR, 403: ERROR, 404: ERROR},
    )
    async def get(self, request, key_id: str):
        if key_id.startswith(SETTINGS_ID_PREFIX):
            return Response(settings_key_json(_settings_key(key_id)))
        row = await sync_to_async(selectors.key_get)(_database_pk(key_id))
        if row is None:
            raise UnknownApiKey(f"no API key has the id {key_id!r}")
        return Response(row_json(row))

    @extend_schema(
        summary="Change an inference key",
        description=f"Any of {FIELDS}, checked as at creation; \"disabled\": true refuses the key (401 "
        "invalid_api_key) on every API process within a second, false lets it in again. 400 invalid_request "
        "(nothing changed), 404 unknown_api_key, 409 api_key_name_taken, 409 api_key_read_only for a key of "
        "settings.json.",
        parameters=[KEY_ID], request={"application/json": body_schema(create=False)},
        responses={200: OpenApiTypes.OBJECT, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 409: ERROR},
    )
    async def patch(self, request, key_id: str):
        if key_id.startswith(SETTINGS_ID_PREFIX):
            raise _read_only(key_id)
        pk = _database_pk(key_id)
        row = await sync_to_async(services.key_update)(pk=pk, changes=body_object(request))
        keys.forget()
        return Response(row_json(row))

    @extend_schema(
        summary="Delete an inference key", parameters=[KEY_ID],
        description="204; the key is refused on every API process within a second. 404 unknown_api_key, "
        "409 api_key_read_only for a key of settings.json.",
        responses={204: None, 401: ERROR, 403: ERROR, 404: ERROR, 409: ERROR},
    )
    async def delete(self, request, key_id: str):
        if key_id.startswith(SETTINGS_ID_PREFIX):
            raise _read_only(key_id)
        await sync_to_async(services.key_delete)(pk=_database_pk(key_id))
        keys.forget()
        return Response(status=204)


def _read_only(key_id: str) -> ApiKeyReadOnly:
    _settings_key(key_id)  # 404 for a name settings.json does not have
    return ApiKeyReadOnly(
        f"the key {key_id!r} comes from settings.json: change it there and reload the settings, or make a key "
        "through this API instead", param="key_id",
    )


class KeyUsageApi(KeysAdminApi):
    @extend_schema(
        summary="An inference key's usage: tokens in and out per model per UTC day",
        description="The key's usage rows of the last `days` days (written by the API processes every few seconds), "
        "their totals, and its budget's period so far; for a key of the database or of settings.json alike. "
        "404 unknown_api_key; 400 invalid_request for a bad `days`.",
        parameters=[KEY_ID, USAGE_DAYS],
        responses={200: OpenApiTypes.OBJECT, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR},
    )
    async def get(self, request, key_id: str):
        if key_id.startswith(SETTINGS_ID_PREFIX):
            key, quota_key = _settings_key(key_id), key_id
        else:
            key = await sync_to_async(selectors.key_get)(_database_pk(key_id))
            if key is None:
                raise UnknownApiKey(f"no API key has the id {key_id!r}")
            quota_key = key.pk
        days = _usage_days(request.query_params.get("days", "30"))
        since = datetime.now(timezone.utc).date() - timedelta(days=days - 1)
        rows = await sync_to_async(selectors.key_usage)(quota_key, since)
        return Response(await usage_json(key, quota_key, rows, since))


def _usage_days(raw: str) -> int:
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw[:6]) <= KEEP_DAYS:
        raise InvalidRequest(f"days must be a whole number from 1 to {KEEP_DAYS}", param="days")
    return int(raw)


async def usage_json(key, quota_key: int | str, rows, since) -> dict:
    """A key's usage as the usage API and the key's workbench page show it: ``key`` a database key's
    row or a key of settings.json, counted under ``quota_key``."""
    listed = [{"day": use.day.isoformat(), "model": use.model, "input_tokens": use.input_tokens,
               "output_tokens": use.output_tokens, "requests": use.requests} for use in rows]
    total = {name: sum(day[name] for day in listed) for name in ("input_tokens", "output_tokens", "requests")}
    budget = None
    if key.token_budget is not None:
        period = BudgetPeriod.at(key.budget_period, time.time())
        used = await sync_to_async(selectors.key_tokens_between)(quota_key, period.first_day, period.last_day)
        budget = {"token_budget": key.token_budget, "budget_period": key.budget_period,
                  "period_start": period.first_day.isoformat(), "used": used,
                  "remaining": max(0, key.token_budget - used)}
    key_id = quota_key if isinstance(quota_key, str) else database_id(quota_key)
    return {"id": key_id, "name": key.name, "since": since.isoformat(), "days": listed, "total": total,
            "budget": budget}
