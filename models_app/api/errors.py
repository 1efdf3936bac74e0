"""The one translation point from exceptions to HTTP error answers.

``error_answer`` writes every error answer: its status, its body and its headers.  The body is
the exception's envelope in the client protocol's shape, by default OpenAI's
``{"error": {"code", "message", "param"}}`` (``LLMPoolError.envelope()``); a protocol whose
clients expect another shape (Anthropic's ``{"type": "error", "error": {...}}``, Ollama's
``{"error": "..."}``) passes its own ``envelope``.  The headers are ``error_headers``' (Retry-After,
the Bearer challenge of a 401) after the caller's own (an ``Allow``, a ``Connection: close``).

Each HTTP stack then frames that one answer: ``error_response`` for DRF views (whose renderer
writes the body: JSON, or an SSE ``error`` event), ``error_json_response`` for plain Django views,
``send_error`` over ASGI (the inference apps), ``ErrorAnswer.http_bytes`` for a connection that
the HTTP server answers before any application runs; a stream that fails after it started
sends ``ErrorAnswer.body`` as its last event.  DRF's own exceptions become errors of the
hierarchy first (``from_drf``), so they take the same path.
"""
from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpResponse
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
from runtime.json_codec import dumps

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

# A protocol's error body: the exception in the shape its clients read.
Envelope = Callable[[LLMPoolError], Any]


def openai_envelope(exc: LLMPoolError) -> dict:
    """``{"error": {"code", "message", "param"}}`` (with ``details`` where the error has them)."""
    return exc.envelope()


@dataclass(frozen=True)
class ErrorAnswer:
    """One error answer: what every HTTP stack sends for an exception."""

    status: int
    body: Any
    headers: dict[str, str]

    def json(self) -> bytes:
        return dumps(self.body)

    def http_bytes(self) -> bytes:
        """The whole HTTP/1.1 answer (head and JSON body), for a connection that is about to close."""
        body = self.json()
        lines = [f"HTTP/1.1 {self.status} {HTTPStatus(self.status).phrase}",
                 "content-type: application/json", f"content-length: {len(body)}",
                 *(f"{name.lower()}: {value}" for name, value in self.headers.items())]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def error_answer(exc: LLMPoolError, *, envelope: Envelope = openai_envelope,
                 headers: dict[str, str] | None = None) -> ErrorAnswer:
    """``exc``'s answer: its status, its body ``envelope(exc)``, ``headers`` then ``error_headers(exc)``."""
    return ErrorAnswer(exc.http_status, envelope(exc), {**(headers or {}), **error_headers(exc)})


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
    answer = error_answer(exc)
    return Response(answer.body, status=answer.status, headers=answer.headers)


def error_json_response(exc: LLMPoolError, headers: dict[str, str] | None = None) -> HttpResponse:
    """``exc``'s answer from a plain Django view; ``headers`` are the view's own (an ``Allow``)."""
    answer = error_answer(exc, headers=headers)
    return HttpResponse(answer.json(), status=answer.status, headers=answer.headers,
                        content_type="application/json")


async def send_error(send, exc: LLMPoolError, headers: dict[str, str] | None = None, *,
                     envelope: Envelope = openai_envelope) -> None:
    """``exc``'s answer over ASGI; ``headers`` are the app's own (an ``Allow``, a ``Connection: close``)."""
    answer = error_answer(exc, envelope=envelope, headers=headers)
    await send_json(send, answer.status, answer.json(), answer.headers)


async def send_json(send, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
    """One complete JSON answer over ASGI (an error's, an inference app's)."""
    extra = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in (headers or {}).items()]
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra],
    })
    await send({"type": "http.response.body", "body": body})


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
