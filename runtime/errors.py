"""One error hierarchy for the whole service.

Every error carries a machine-readable ``code`` and the ``http_status`` the API
answers with (plus ``retry_after`` seconds where a retry makes sense).  Errors
cross the channel layer as plain dicts (``to_dict`` / ``error_from_dict``).
``envelope()`` is the one writer of the error envelope
``{"error": {"code", "message", "param"}}``: ``models_app.api.errors`` frames it (and the
headers) for each HTTP stack, and a stream sends it as its last event.
"""
from __future__ import annotations


class LLMPoolError(Exception):
    code = "internal_error"
    http_status = 500
    retry_after: int | None = None

    def __init__(self, message: str = "", *, param: str | None = None, details=None):
        super().__init__(message or self.code)
        self.message = message or self.code
        self.param = param
        self.details = details

    def envelope(self) -> dict:
        envelope = {"error": {"code": self.code, "message": self.message, "param": self.param}}
        if _public_details(self.details):
            envelope["error"]["details"] = self.details
        return envelope

    def to_dict(self) -> dict:
        return {
            "code": self.code,
            "message": self.message,
            "param": self.param,
            "http_status": self.http_status,
            "retry_after": self.retry_after,
            "details": self.details,
        }


def _public_details(details) -> bool:
    """Details the envelope carries: settings problems with a machine-readable ``code``
    each (a model's ``node``), and a reload that nodes refused (``refused_by``, docs/api.md)."""
    if isinstance(details, dict):
        return "refused_by" in details
    return isinstance(details, list) and any(isinstance(p, dict) and "code" in p for p in details)


def _error(name: str, code: str, http_status: int, retry_after: int | None = None):
    cls = type(name, (LLMPoolError,), {"code": code, "http_status": http_status, "retry_after": retry_after})
    _REGISTRY[code] = cls
    return cls


_REGISTRY: dict[str, type[LLMPoolError]] = {"internal_error": LLMPoolError}

# Request errors (POST /v1/responses).
UnknownModel = _error("UnknownModel", "unknown_model", 404)
ModelNotLoaded = _error("ModelNotLoaded", "model_not_loaded", 409)
ModelFailed = _error("ModelFailed", "model_failed", 409)
ModelLoading = _error("ModelLoading", "model_loading", 503, retry_after=5)
ModelUnloading = _error("ModelUnloading", "model_unloading", 503, retry_after=5)
RuntimeUnavailable = _error("RuntimeUnavailable", "runtime_unavailable", 503, retry_after=2)
InvalidRequest = _error("InvalidRequest", "invalid_request", 400)
RequestTooLarge = _error("RequestTooLarge", "request_too_large", 413)
# A fairness key (a fairness header or the body's user) longer than the edge's limit.
FairnessKeyTooLong = _error("FairnessKeyTooLong", "fairness_key_too_long", 400)
NotFound = _error("NotFound", "not_found", 404)  # a path under /v1 that names no endpoint
# A method the endpoint does not have (answered with its Allow header).
MethodNotAllowed = _error("MethodNotAllowed", "method_not_allowed", 405)
# DRF's permission refusal (an admin view whose permission says no without raising).
Forbidden = _error("Forbidden", "forbidden", 403)
# A DRF refusal this service has no code of its own for: an Accept header none of an admin
# view's renderers satisfies (its status is DRF's, 406 there).
ApiError = _error("ApiError", "api_error", 406)
FileInputUnsupported = _error("FileInputUnsupported", "file_input_unsupported", 400)
ModalityUnsupported = _error("ModalityUnsupported", "modality_unsupported", 400)
ThinkingUnsupported = _error("ThinkingUnsupported", "thinking_unsupported", 400)
ResponseFormatUnsupported = _error("ResponseFormatUnsupported", "response_format_unsupported", 400)
MultiTurnUnsupported = _error("MultiTurnUnsupported", "multi_turn_unsupported", 400)
# Tools (with a tool_choice other than "none"), tool calls or tool results for a model without
# capabilities.tools, or a tool_choice kind it does not honour (param tool_choice).
ToolsUnsupported = _error("ToolsUnsupported", "tools_unsupported", 400)
# POST /v1/embeddings to a model whose definition does not say embeddings: true.
EmbeddingsUnsupported = _error("EmbeddingsUnsupported", "embeddings_unsupported", 400)
# POST /v1/audio/transcriptions (or translations) to a model without capabilities.audio_transcription.
TranscriptionUnsupported = _error("TranscriptionUnsupported", "transcription_unsupported", 400)
# POST /v1/rerank to a model whose definition does not say rerank: true.
RerankUnsupported = _error("RerankUnsupported", "rerank_unsupported", 400)
# An embedding, rerank or transcription asked of a LoRA adapter's model id: adapters serve generation only.
AdapterUnsupported = _error("AdapterUnsupported", "adapter_unsupported", 400)
# A request for a declared LoRA adapter that the loaded model's adapters_loaded override left out.
AdapterNotLoaded = _error("AdapterNotLoaded", "adapter_not_loaded", 409)
# A token count (POST /v1/messages/count_tokens, .../input_tokens) for a model whose engine has no tokenizer here.
TokenCountUnsupported = _error("TokenCountUnsupported", "token_count_unsupported", 400)
# A raw text prompt (POST /v1/completions) for a model whose engine runs chat messages only.
RawPromptUnsupported = _error("RawPromptUnsupported", "raw_prompt_unsupported", 400)
# Inference keys (service.api_keys): a missing or unknown key, and a model the key may not use.
InvalidApiKey = _error("InvalidApiKey", "invalid_api_key", 401)
ModelNotAllowed = _error("ModelNotAllowed", "model_not_allowed", 403)
# The keys API (/v1/admin/keys): an id that names no key, a name another key has, a change to a key
# of settings.json (the file is its source), and a key ring the database could not give yet.
UnknownApiKey = _error("UnknownApiKey", "unknown_api_key", 404)
ApiKeyNameTaken = _error("ApiKeyNameTaken", "api_key_name_taken", 409)
ApiKeyReadOnly = _error("ApiKeyReadOnly", "api_key_read_only", 409)
ApiKeysUnavailable = _error("ApiKeysUnavailable", "api_keys_unavailable", 503, retry_after=1)
# The keys API without service.admin_token: anyone who reaches the port could mint keys.
AdminTokenRequired = _error("AdminTokenRequired", "admin_token_required", 403)
RemoteExecutionDisallowed = _error("RemoteExecutionDisallowed", "remote_execution_disallowed", 403)
FairnessKeyQueueFull = _error("FairnessKeyQueueFull", "fairness_key_queue_full", 429, retry_after=1)
ExecutorQueueFull = _error("ExecutorQueueFull", "executor_queue_full", 429, retry_after=1)
# A queued request whose queue timeout (X-LLMPool-Queue-Timeout, or its model's queue_timeout_seconds)
# ran out before a replica was free: dropped unstarted.
QueueDeadlineExceeded = _error("QueueDeadlineExceeded", "queue_deadline_exceeded", 503, retry_after=1)
# A queue timeout header that is not a number of seconds above 0 and within the bound.
InvalidQueueTimeout = _error("InvalidQueueTimeout", "invalid_queue_timeout", 400)
# A priority header (service.priority_header) naming no class, or a class above the API key's.
InvalidPriority = _error("InvalidPriority", "invalid_priority", 400)
PriorityNotAllowed = _error("PriorityNotAllowed", "priority_not_allowed", 403)
# An inference key over one of its limits (models_app.quotas): Retry-After is set from the window.
RateLimited = _error("RateLimited", "rate_limited", 429, retry_after=1)
TokenRateLimited = _error("TokenRateLimited", "token_rate_limited", 429, retry_after=1)
ConcurrencyLimited = _error("ConcurrencyLimited", "concurrency_limited", 429, retry_after=1)
BudgetExhausted = _error("BudgetExhausted", "budget_exhausted", 429, retry_after=1)
# A backend that broke while generating; the model moves to failed when the engine is dead.
BackendError = _error("BackendError", "backend_error", 502)
# The model's request_timeout_seconds ran out while the engine held the request (slot freed).
RequestTimeout = _error("RequestTimeout", "request_timeout", 504)
# The client did not send its whole body within service.request_body_timeout_seconds.
RequestBodyTimeout = _error("RequestBodyTimeout", "request_body_timeout", 408)
# The request head did not arrive within service.http_head_timeout_seconds (the HTTP server's answer).
RequestHeadTimeout = _error("RequestHeadTimeout", "request_head_timeout", 408)
# A connection over service.max_connections (the HTTP server's answer, then the close).
TooManyConnections = _error("TooManyConnections", "too_many_connections", 503, retry_after=1)
ContextLengthExceeded = _error("ContextLengthExceeded", "context_length_exceeded", 400)
# A remote OpenAI-compatible API (openai_remote) failed or timed out.
UpstreamError = _error("UpstreamError", "upstream_error", 502)
# Ollama's model management (pull, push, create, copy, delete): models are declared in settings.json.
ModelManagementUnsupported = _error("ModelManagementUnsupported", "model_management_unsupported", 405)

# Admin errors.
InvalidLoadRequest = _error("InvalidLoadRequest", "invalid_load_request", 400)
LoadBodyInvalid = _error("LoadBodyInvalid", "invalid_load_body", 422)
ModelStateConflict = _error("ModelStateConflict", "model_state_conflict", 409)
SettingsReloadConflict = _error("SettingsReloadConflict", "settings_reload_conflict", 409)
# A reload over several nodes that another node refused (or whose decision never came): nothing changed.
SettingsReloadAborted = _error("SettingsReloadAborted", "settings_reload_aborted", 409)
InvalidSettings = _error("InvalidSettings", "invalid_settings", 400)
Unauthorized = _error("Unauthorized", "unauthorized", 401)
UnknownOperation = _error("UnknownOperation", "unknown_operation", 400)
# A reconfigure (runtime.model.residency) naming a field its backend cannot change while loaded.
NotReconfigurable = _error("NotReconfigurable", "not_reconfigurable", 400)
# A sleep for a model whose backend has no warm tier (runtime.model.residency).
NotSleepable = _error("NotSleepable", "not_sleepable", 400)


class InsufficientMemory(LLMPoolError):
    """A load that does not fit its device's free budget (runtime.pool.memory): 409, and the plan
    ``{"device", "needed_mib", "free_mib", "evictable", "blocking"}`` in the envelope's
    ``details`` (a key of this error's envelope only; docs/api.md)."""

    code = "insufficient_memory"
    http_status = 409

    def envelope(self) -> dict:
        envelope = super().envelope()
        envelope["error"]["details"] = self.details
        return envelope


_REGISTRY[InsufficientMemory.code] = InsufficientMemory


def error_from_dict(data: dict) -> LLMPoolError:
    """Rebuild an error that crossed the channel layer."""
    cls = _REGISTRY.get(data.get("code"), LLMPoolError)
    error = cls(data.get("message", ""), param=data.get("param"), details=data.get("details"))
    if cls is LLMPoolError:
        error.code = data.get("code") or "internal_error"
        error.http_status = data.get("http_status") or 500
    return error


def error_codes() -> frozenset[str]:
    """Every code this registry knows (the bounded values of a metric's ``code`` label)."""
    return frozenset(_REGISTRY)
