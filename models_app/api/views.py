"""The HTTP API: one async DRF view per operation.  Views never touch runtime objects;
they validate input, send one message to the runtime and shape its answer."""
from __future__ import annotations

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_serializer,
    inline_serializer,
)
from rest_framework import serializers
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response

from models_app import placement
from models_app import selectors, services
from models_app.api import openai_models
from models_app.api.auth import AdminTokenPermission
from models_app.api.base import APIView
from models_app.api.errors import error_json_response, error_response
from models_app.api.model_logs import logs_follow, logs_tail
from models_app.api.event_stream import sse_event, transition_stream
from models_app.api.keys import key_ring
from models_app.api.limits import BodyRefused, refused_as
from models_app.transport.messages import OP_CATALOG
from runtime.config import LoadBody
from runtime.errors import InvalidRequest, LLMPoolError, LoadBodyInvalid, NotFound

ERROR = inline_serializer(
    "ErrorEnvelope",
    {
        "error": inline_serializer(
            "ErrorBody",
            {"code": serializers.CharField(), "message": serializers.CharField(), "param": serializers.CharField(allow_null=True)},
        )
    },
)


class AdminModelEntrySerializer(serializers.Serializer):
    """One configured model with its live runtime state (the admin UI's source of truth)."""

    name = serializers.CharField()
    resolved_backend = serializers.CharField()
    configured_enabled = serializers.BooleanField(help_text="What the merged config says (start-up loading).")
    runtime_state = serializers.ChoiceField(
        ["unloaded", "loading", "loaded", "unloading", "failed"], help_text="The live lifecycle state."
    )
    is_loaded = serializers.BooleanField()
    replicas = serializers.IntegerField(help_text="Current effective replica count.")
    replica_max = serializers.IntegerField()
    loaded_replicas = serializers.IntegerField()
    inflight_requests = serializers.IntegerField(help_text="Admitted requests: queued plus active.")
    queue_depth = serializers.IntegerField()
    runtime_inflight = serializers.IntegerField()
    configured_target_inflight = serializers.IntegerField()
    effective_target_inflight = serializers.IntegerField()
    fairness = serializers.DictField()
    last_error = serializers.CharField(allow_null=True)
    vram_estimate_mib = serializers.IntegerField(allow_null=True)
    vram_estimate_replica_count = serializers.IntegerField()
    vram_estimate_source = serializers.ChoiceField(["observed_load_delta", "model_artifact_size", "unavailable"])
    load_constraints = serializers.DictField(help_text="Backend-specific live-load fields for UI controls.")
    load_recommendations = serializers.DictField()
    load_override = serializers.DictField(help_text="Sparse runtime-only patch; key presence matters.")
    capabilities = serializers.DictField()
    definition = serializers.DictField(help_text="Common fields plus the resolved backend's fields.")
    # Models that switch by themselves (docs/api.md, docs/settings.md).
    group = serializers.CharField(allow_null=True, help_text="The swap group the model is a member of.")
    idle_expires_at = serializers.DateTimeField(
        allow_null=True, help_text="When ttl_seconds unloads the idle model if no request comes (UTC); null when "
        "not counting down (busy, not loaded, no TTL, pinned)."
    )
    keep_alive_seconds = serializers.FloatField(
        allow_null=True, help_text="The TTL a request's keep_alive set (Ollama's API, with service.ollama_keep_alive) "
        "until the model unloads: seconds, negative for none; null: the definition's ttl_seconds holds."
    )
    last_request_at = serializers.DateTimeField(allow_null=True, help_text="When the last request arrived (UTC).")
    waiting_requests = serializers.IntegerField(
        help_text="Requests waiting for the model to load (load_on_request), not yet queued."
    )
    stats = serializers.DictField(
        help_text="Rolling figures of the last 5 minutes (docs/observability.md): window_seconds, "
        "requests, errors, ttft_p50_ms, ttft_p95_ms, output_tokens, tokens_per_second."
    )
    last_reason = serializers.ChoiceField(
        ["admin", "startup", "request", "ttl", "group_swap", "keep_warm", "engine_failure", "memory_eviction"],
        allow_null=True, help_text="Why the last lifecycle operation (load or unload) happened.",
    )
    # Memory-aware placement (docs/api.md, docs/settings.md "Memory and devices").
    placement = serializers.ListField(
        child=serializers.CharField(), allow_null=True,
        help_text="The devices of the current or last load (cpu, cuda:N); null before any load.",
    )
    memory = serializers.DictField(
        allow_null=True, help_text="estimate_mib and estimate_source (estimate, measured, raised_after_oom, "
        "unavailable) of the next load, charge_mib per device and charge (reserved, measured or null) held now, "
        "awaiting_memory.",
    )
    # Load progress (docs/observability.md).
    load_progress = serializers.DictField(
        allow_null=True, help_text="While loading: {stage, fraction} (fraction 0..1 or null where the stage has "
        "no measure); null otherwise or before the first report.",
    )
    # The warm tier (docs/api.md "Reconfigure and sleep").
    residency = serializers.ChoiceField(
        ["active", "sleeping"], help_text="sleeping: loaded, its inference state (KV cache) freed, its weights kept; "
        "a request wakes it. active otherwise.",
    )
    sleepable = serializers.BooleanField(
        required=False, help_text="Whether its backend can sleep (POST .../sleep is not 400 not_sleepable)."
    )
    # What clients size prompts by (docs/api.md "The AdminModelEntry").
    context_length = serializers.IntegerField(
        allow_null=True, help_text="The tokens one request may use (effective config, server limit or the GGUF "
        "file's trained context); null when none is known.",
    )
    model_file = serializers.DictField(
        allow_null=True, help_text="A local GGUF file's description: format, size_bytes, architecture, basename, "
        "size_label, quantization, trained_context_length; null without one.",
    )
    # Several nodes, one pool (docs/api.md "Several nodes").
    node = serializers.CharField(
        help_text="The node whose runtime answered this entry (LLMPOOL_NODE_ID, default the host name)."
    )


class AdminApi(APIView):
    permission_classes = [AdminTokenPermission]


class ActivityApi(AdminApi):
    @extend_schema(
        summary="Recent requests (the runtime's activity ring)",
        description="The last service.activity_requests finished requests, newest first: time, model, endpoint, "
        "fairness key, status, error code, tokens, time to first token, duration, tokens/s, replica. Prompt and "
        "answer text only with service.capture_requests (each item's capture). ?model= (a name or alias; 404 "
        "unknown_model), ?limit= (1 to the ring's size; else 400 invalid_request). docs/observability.md.",
        responses={200: OpenApiTypes.OBJECT, 400: ERROR, 401: ERROR, 404: ERROR, 503: ERROR},
    )
    async def get(self, request):
        query = request.query_params
        return Response(await selectors.activity(model=query.get("model"), limit=query.get("limit")))


class ModelListApi(AdminApi):
    @extend_schema_serializer(component_name="ModelList")
    class OutputSerializer(serializers.Serializer):
        models = AdminModelEntrySerializer(many=True)

    @extend_schema(
        summary="List models",
        description="Every model of the merged settings.json + local.json with its live runtime state.",
        responses={200: OutputSerializer, 401: ERROR, 503: ERROR},
    )
    async def get(self, request):
        return Response(await selectors.models_answer())


def load_body_schema() -> dict:
    """The load body's OpenAPI 3.0 schema, from the runtime's LoadBody (every backend's declared
    overrides): pydantic's ``anyOf [T, null]`` becomes ``T`` with ``nullable``."""
    schema = LoadBody.model_json_schema()
    properties = {}
    for name, field in schema["properties"].items():
        kinds = [kind for kind in field.get("anyOf", [field]) if kind.get("type") != "null"]
        properties[name] = {**kinds[0], "nullable": True}
    return {"type": "object", "additionalProperties": False, "properties": properties}


def load_body(request) -> dict | None:
    """The load body, or None without one; JSON ``null`` or a body past the limits is 422 invalid_load_body."""
    if not request.body:
        return None
    try:
        data = request.data
    except BodyRefused as exc:
        raise refused_as(exc, LoadBodyInvalid) from None
    if data is None:
        raise LoadBodyInvalid("the load body must be a JSON object (send no body for the configured defaults)")
    return data


class ModelLoadApi(AdminApi):
    @extend_schema(
        summary="Load a model",
        description=(
            "Loads a configured model and answers once it is loaded or failed (200 with the entry). "
            "Already loaded or loading: 200 with the current state. The optional body selects replicas, "
            "target_inflight (concurrent server backends) and backend-specific overrides for this one load. "
            "422: body fails the schema; 400 invalid_load_request: values invalid for the backend or state; "
            "409 model_state_conflict: the model is unloading; 409 insufficient_memory: it does not fit its "
            "device's free budget (the plan in error.details). ?dry_run=true answers the plan (fits, action, "
            "placement, device, needed_mib, free_mib, evictable, blocking, evict) and acts on nothing."
        ),
        request={"application/json": load_body_schema()},
        parameters=[
            OpenApiParameter("model_name", str, OpenApiParameter.PATH),
            OpenApiParameter("dry_run", bool, OpenApiParameter.QUERY, description="Answer the memory plan only."),
        ],
        responses={200: AdminModelEntrySerializer, 400: ERROR, 401: ERROR, 404: ERROR, 409: ERROR, 422: ERROR, 503: ERROR},
    )
    async def post(self, request, model_name: str):
        dry_run = request.query_params.get("dry_run", "false").lower()
        if dry_run not in ("true", "false", "1", "0"):
            raise InvalidRequest("dry_run must be true or false", param="dry_run")
        return Response(await services.model_load(model_name, load_body(request), dry_run in ("true", "1")))


class ModelUnloadApi(AdminApi):
    @extend_schema(
        summary="Unload a model",
        description=(
            "Graceful unload: new requests are rejected at once, queued ones get model_unloading, active ones "
            "finish, then resources are released. Already unloaded, failed or unloading: 200. "
            "409 model_state_conflict while loading."
        ),
        request=None,
        parameters=[OpenApiParameter("model_name", str, OpenApiParameter.PATH)],
        responses={200: AdminModelEntrySerializer, 401: ERROR, 404: ERROR, 409: ERROR, 503: ERROR},
    )
    async def post(self, request, model_name: str):
        return Response(await services.model_unload(model_name))


class ModelReconfigureApi(AdminApi):
    @extend_schema(
        summary="Reconfigure a loaded model (docs/api.md)",
        description=(
            "Changes the fields whose load_constraints entry says \"reconfigurable\": true while the model stays "
            "loaded and its weights stay in memory: admission pauses (new requests queue), active requests finish, "
            "the engines rebuild their inference state, admission resumes. The body is checked as a load body "
            "(422); a field that is not reconfigurable is 400 not_reconfigurable; a value the backend rejects "
            "is 400 invalid_load_request with the old configuration rebuilt; a context below a queued request's "
            "size is 400; 409 insufficient_memory when it does not fit (nothing changed); 409 model_not_loaded "
            "or model_state_conflict. Answers the entry with reconfigured {duration_ms, changed, reason}."
        ),
        request={"application/json": load_body_schema()},
        parameters=[OpenApiParameter("model_name", str, OpenApiParameter.PATH)],
        responses={200: OpenApiTypes.OBJECT, 400: ERROR, 401: ERROR, 404: ERROR, 409: ERROR, 422: ERROR, 503: ERROR},
    )
    async def post(self, request, model_name: str):
        return Response(await services.model_reconfigure(model_name, load_body(request)))


class ModelSleepApi(AdminApi):
    op = "sleep"

    @extend_schema(
        summary="Put a loaded model to sleep, or wake it (docs/api.md)",
        description=(
            "sleep: once its active requests finish, the model frees its inference state (llama_cpp: the context "
            "and KV cache) and keeps its weights; it stays loaded with residency \"sleeping\", and a request "
            "wakes it (and waits). wake: builds the inference state again (residency \"active\"). 400 "
            "not_sleepable for a backend without a warm tier; 409 model_not_loaded or model_state_conflict; "
            "409 insufficient_memory when a wake does not fit (the plan in error.details; it stays asleep)."
        ),
        request=None,
        parameters=[OpenApiParameter("model_name", str, OpenApiParameter.PATH)],
        responses={200: OpenApiTypes.OBJECT, 400: ERROR, 401: ERROR, 404: ERROR, 409: ERROR, 503: ERROR},
    )
    async def post(self, request, model_name: str):
        return Response(await services.model_residency(model_name, self.op))


class ModelWakeApi(ModelSleepApi):
    op = "wake"


class GpuMemoryApi(AdminApi):
    @extend_schema_serializer(component_name="GpuMemory")
    class OutputSerializer(serializers.Serializer):
        gpus = serializers.ListField(child=serializers.DictField())
        models = serializers.ListField(child=serializers.DictField())
        error = serializers.CharField(allow_null=True)
        # Each device's budget and charges (docs/api.md "GET /v1/admin/gpu-memory").
        devices = serializers.ListField(child=serializers.DictField(), required=False)

    @extend_schema(
        summary="GPU memory and per-model VRAM estimates",
        description="Current GPU memory usage (NVML) and each model's VRAM estimate; gpus is empty and error "
        "says why when no GPU is visible.",
        responses={200: OutputSerializer, 401: ERROR, 503: ERROR},
    )
    async def get(self, request):
        return Response(await selectors.gpu_memory())


class SettingsReloadApi(AdminApi):
    @extend_schema_serializer(component_name="SettingsReloadResult")
    class OutputSerializer(serializers.Serializer):
        added_models = serializers.ListField(child=serializers.CharField())
        removed_models = serializers.ListField(child=serializers.CharField())
        updated_models = serializers.ListField(child=serializers.CharField())
        unchanged_models = serializers.ListField(child=serializers.CharField())
        service_restart_required = serializers.BooleanField()

    @extend_schema(
        summary="Reload settings",
        description=(
            "Rereads settings.json and local.json and swaps the catalog atomically; loads and unloads nothing. "
            "400 invalid_settings or 409 settings_reload_conflict leave the catalog unchanged."
        ),
        request=None,
        responses={200: OutputSerializer, 400: ERROR, 401: ERROR, 409: ERROR, 503: ERROR},
    )
    async def post(self, request):
        return Response(await services.settings_reload())


class EventStreamRenderer(BaseRenderer):
    """text/event-stream; an error answer (401) is one ``error`` event whose data is the error envelope."""

    media_type = "text/event-stream"
    format = "event-stream"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return sse_event("error", data)


class ModelLogsApi(AdminApi):
    renderer_classes = [JSONRenderer, EventStreamRenderer]

    @extend_schema(
        summary="A model's server / engine process output",
        description="The newest ?lines= (1 to 200, default 100) lines of each loaded replica's managed server or "
        "engine process output: {model, replicas: [{replica, kind, running, lines, next}]}. With ?follow=true a "
        "text/event-stream of `log` events {replica, line}: the tail, then each new line until the client leaves. "
        "docs/observability.md.",
        responses={200: OpenApiTypes.OBJECT, 400: ERROR, 401: ERROR, 404: ERROR, 503: ERROR},
    )
    async def get(self, request, model_name: str):
        first = await logs_tail(model_name, request.query_params.get("lines"))  # errors before the stream
        if request.query_params.get("follow", "").lower() not in ("1", "true", "yes"):
            return Response(first)
        response = StreamingHttpResponse(logs_follow(first, model_name), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response


class AdminEventStreamApi(AdminApi):
    renderer_classes = [JSONRenderer, EventStreamRenderer]

    @extend_schema(
        summary="Stream lifecycle transitions (Server-Sent Events)",
        description=(
            "A text/event-stream of every model's lifecycle transitions, as they happen, until the client "
            "disconnects. The stream opens with a comment once the subscription is in place; a comment every "
            "15 s keeps it alive. Each transition is one event named `transition` whose data is a JSON object: "
            "`model`, `from` and `to` (unloaded, loading, loaded, unloading, failed), `at` (ISO 8601 UTC) and "
            "`last_error` (the error when `to` is failed, else null). Example:\n\n"
            "```\nevent: transition\ndata: {\"model\":\"stub-echo\",\"from\":\"loading\",\"to\":\"failed\","
            "\"at\":\"2026-01-01T12:00:00.123Z\",\"last_error\":\"weights are corrupt\"}\n```\n\n"
            "Requires the admin token like every /v1/admin endpoint. With ?progress=true the stream "
            "also carries `load_progress` events, {model, load_progress: {stage, fraction}, at}, while a model "
            "loads (docs/observability.md)."
        ),
        parameters=[
            OpenApiParameter("progress", bool, OpenApiParameter.QUERY,
                             description="Also send load_progress events (default false)."),
        ],
        responses={
            (200, "text/event-stream"): OpenApiResponse(
                response=OpenApiTypes.STR, description="The transition event stream."
            ),
            400: ERROR,  # ?progress= neither true nor false
            401: ERROR,
            404: ERROR,  # an unknown ?format=
        },
    )
    async def get(self, request):
        progress = request.query_params.get("progress", "false").lower()
        if progress not in ("true", "false", "1", "0"):
            raise InvalidRequest("progress must be true or false", param="progress")
        stream = transition_stream(progress=progress in ("true", "1"))
        response = StreamingHttpResponse(stream, content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response


class OpenAIModelListApi(APIView):
    @extend_schema(
        operation_id="v1_models_list",
        summary="List models (OpenAI shape)",
        description=(
            "`{object: \"list\", data: [{id, object: \"model\", created, owned_by, runtime_state, backend, "
            "capabilities}]}`: every configured model, or only the loaded ones with service.list_models "
            "\"loaded\"; with service.api_keys set, only those the key may use (no key: 401 invalid_api_key)."
        ),
        responses={200: OpenApiTypes.OBJECT, 401: ERROR, 503: ERROR},
    )
    async def get(self, request):
        return Response(await openai_models.model_list((await key_ring()).caller(request.headers.get)))


class OpenAIModelApi(APIView):
    @extend_schema(
        operation_id="v1_models_retrieve",
        summary="One model (OpenAI shape)",
        description=(
            "Any configured model, whatever service.list_models lists; 404 unknown_model otherwise. With "
            "service.api_keys set: 401 invalid_api_key without a key, 403 model_not_allowed for a model the key "
            "may not use."
        ),
        parameters=[OpenApiParameter("model_id", str, OpenApiParameter.PATH)],
        responses={200: OpenApiTypes.OBJECT, 401: ERROR, 403: ERROR, 404: ERROR, 503: ERROR},
    )
    async def get(self, request, model_id: str):
        return Response(await openai_models.model_get(model_id, (await key_ring()).caller(request.headers.get)))


async def unknown_path(request, *args, **kwargs):
    """Every path under /v1 that names no endpoint: the error envelope, never Django's HTML page."""
    return error_json_response(NotFound(f"no endpoint at {request.path}"))


class HealthApi(APIView):
    @extend_schema(
        summary="Liveness of the API and the runtime",
        description="200 when the runtime answers within service.runtime_reply_timeout_seconds, else 503.",
        responses={200: OpenApiTypes.OBJECT, 503: ERROR},
    )
    async def get(self, request):
        try:
            catalog = await placement.call(OP_CATALOG)
        except LLMPoolError as exc:
            return error_response(exc)
        return Response({"status": "ok", "models": len(catalog["models"])})
