"""The one translation point from exceptions to HTTP error answers.

``LLMPoolError.envelope()`` (runtime.errors) is the only writer of the envelope
``{"error": {"code", "message", "param"}}`` and ``error_headers`` the only source of the headers an
error answer carries.  Each HTTP stack frames the two its own way: ``error_response`` for DRF
views, ``error_json_response`` for plain Django views, ``inference.send_error`` over ASGI, and
``llmpool.http_protocol.error_answer`` in raw bytes before any application runs.  DRF's own
exceptions become errors of the hierarchy first (``from_drf``), so they take the same path.
"""
from __future__ import annotations

import logging
import uuid

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, JsonResponse
from rest_framework import exceptions as drf
from rest_framework.response import Response

from runtime.errors import (
    ApiError,
    Forbidden,
    InvalidApiKey,
    InvalidRequest,
    LLMPoolError,
    MethodNotAllowed,
    NotFound,
    RequestTooLarge,
    Unauthorized,
)

logger = logging.getLogger("llmpool.api")

# DRF's exceptions by the error class whose code they answer with; any other is ApiError.
_DRF_ERRORS = {
    drf.ParseError: InvalidRequest,
    drf.UnsupportedMediaType: InvalidRequest,
    drf.MethodNotAllowed: MethodNotAllowed,
    drf.NotFound: NotFound,
    drf.NotAuthenticated: Unauthorized,
    drf.AuthenticationFailed: Unauthorized,
    drf.PermissionDenied: Forbidden,
    drf.ValidationError: InvalidRequest,
}


def error_headers(exc: LLMPoolError) -> dict[str, str]:
    """The HTTP headers an error answer carries: Retry-After, and the Bearer challenge of a 401."""
    headers = {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(exc.retry_after)
    if isinstance(exc, InvalidApiKey):
        headers["WWW-Authenticate"] = 'Bearer realm="llm-pool"'
    elif exc.http_status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="llm-pool admin"'
    return headers


def error_response(exc: LLMPoolError) -> Response:
    """``exc``'s answer from a DRF view."""
    return Response(exc.envelope(), status=exc.http_status, headers=error_headers(exc))


def error_json_response(exc: LLMPoolError, headers: dict[str, str] | None = None) -> JsonResponse:
    """``exc``'s answer from a plain Django view; ``headers`` are the view's own (an ``Allow``)."""
    return JsonResponse(exc.envelope(), status=exc.http_status, headers={**(headers or {}), **error_headers(exc)})


def internal_error(where: str) -> LLMPoolError:
    """A 500 for an unexpected exception (being handled): logged with a request id, which is all
    the answer says, so no internal detail reaches the client."""
    request_id = uuid.uuid4().hex[:16]
    logger.exception("unhandled error in %s (request id %s)", where, request_id)
    return LLMPoolError(f"internal error (request id {request_id})")


def from_drf(exc: drf.APIException) -> LLMPoolError:
    """DRF's exception as an error of the hierarchy, with DRF's status (415 for an unsupported
    media type, which answers ``invalid_request`` as a 400 parse error does) and its detail."""
    cls = next((error for drf_class, error in _DRF_ERRORS.items() if isinstance(exc, drf_class)), ApiError)
    error = cls(str(exc.detail))
    error.http_status = exc.status_code
    return error


def exception_handler(exc, context):
    if isinstance(exc, Http404):  # DRF's own handler does this too (an unknown ?format= raises it)
        exc = drf.NotFound()
    if isinstance(exc, RequestDataTooBig):
        exc = RequestTooLarge(f"the request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes")
    if isinstance(exc, drf.APIException):
        exc = from_drf(exc)
    if isinstance(exc, LLMPoolError):
        return error_response(exc)
    return error_response(internal_error(type(context.get("view")).__name__))
