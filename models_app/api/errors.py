"""The one translation point from exceptions to the error envelope."""
from __future__ import annotations

import logging
import uuid

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from rest_framework import exceptions as drf
from rest_framework.response import Response

from runtime.errors import InvalidApiKey, LLMPoolError, RequestTooLarge

logger = logging.getLogger("llmpool.api")

_DRF_CODES = {
    drf.ParseError: "invalid_request",
    drf.UnsupportedMediaType: "invalid_request",
    drf.MethodNotAllowed: "method_not_allowed",
    drf.NotFound: "not_found",
    drf.NotAuthenticated: "unauthorized",
    drf.AuthenticationFailed: "unauthorized",
    drf.PermissionDenied: "forbidden",
    drf.ValidationError: "invalid_request",
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
    return Response(exc.envelope(), status=exc.http_status, headers=error_headers(exc))


def internal_error(where: str) -> LLMPoolError:
    """A 500 for an unexpected exception (being handled): logged with a request id, which is all
    the answer says, so no internal detail reaches the client."""
    request_id = uuid.uuid4().hex[:16]
    logger.exception("unhandled error in %s (request id %s)", where, request_id)
    return LLMPoolError(f"internal error (request id {request_id})")


def exception_handler(exc, context):
    if isinstance(exc, Http404):  # DRF's own handler does this too (an unknown ?format= raises it)
        exc = drf.NotFound()
    if isinstance(exc, RequestDataTooBig):
        exc = RequestTooLarge(f"the request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes")
    if isinstance(exc, LLMPoolError):
        return error_response(exc)
    if isinstance(exc, drf.APIException):
        code = next((c for cls, c in _DRF_CODES.items() if isinstance(exc, cls)), "api_error")
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        body = {"error": {"code": code, "message": detail, "param": None}}
        return Response(body, status=exc.status_code)
    return error_response(internal_error(type(context.get("view")).__name__))
