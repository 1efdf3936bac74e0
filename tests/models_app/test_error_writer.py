"""One writer of the error envelope (``LLMPoolError.envelope()`` in runtime/errors.py) and of every
error answer (``api.errors.error_answer``: status, body in the protocol's shape, headers), and DRF's
own exceptions answered through it with the codes and statuses docs/api.md lists."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from rest_framework import exceptions as drf

from models_app.api.errors import error_answer, error_json_response, exception_handler, send_error
from models_app.api.inference import inference_app
from runtime.errors import FairnessKeyQueueFull, InvalidApiKey, LLMPoolError, RuntimeUnavailable

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("models_app", "llmpool", "runtime")
THE_WRITER = Path("runtime/errors.py")
THE_ANSWER_WRITER = Path("models_app/api/errors.py")
ENVELOPE_FIELDS = {"code", "message", "param"}


def _is_schema(node: ast.Dict) -> bool:
    """A dict of serializer fields (``{"code": serializers.CharField(), ...}``) or of JSON schema
    properties (``{"code": {"type": "string"}, ...}``) declares the envelope's OpenAPI schema; it
    writes no answer."""
    return all(_is_field(value) or _is_json_schema(value) for value in node.values)


def _is_field(value: ast.expr) -> bool:
    return (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
            and isinstance(value.func.value, ast.Name) and value.func.value.id == "serializers")


def _is_json_schema(value: ast.expr) -> bool:
    return isinstance(value, ast.Dict) and any(
        isinstance(key, ast.Constant) and key.value == "type" for key in value.keys)


def _builds_envelope(node: ast.Dict) -> bool:
    keys = {key.value for key in node.keys if isinstance(key, ast.Constant) and isinstance(key.value, str)}
    inner = ENVELOPE_FIELDS <= keys and not _is_schema(node)
    outer = (len(node.keys) == 1 and isinstance(node.keys[0], ast.Constant) and node.keys[0].value == "error"
             and isinstance(node.values[0], ast.Dict))
    return inner or outer


def hand_built_envelopes(root: Path) -> list[str]:
    """``path:line`` of each dict literal shaped like the envelope (``{"error": {...}}``) or its
    ``error`` object (``code``, ``message`` and ``param``), outside the one writer.  A node's
    status in a merged admin answer (``{"node", "alive", "error": {"code", "message"}}``) is
    neither."""
    found = []
    for package in SCANNED:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            if relative == THE_WRITER or "migrations" in relative.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Dict) and _builds_envelope(node):
                    found.append(f"{relative}:{node.lineno}")
    return found


def test_only_runtime_errors_writes_the_envelope():
    assert hand_built_envelopes(ROOT) == []


def envelope_calls(root: Path) -> list[str]:
    """``path:line`` of each ``.envelope()`` call outside the two writers: everything else takes
    the body from ``error_answer``."""
    found = []
    for package in SCANNED:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            if relative in (THE_WRITER, THE_ANSWER_WRITER):
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "envelope":
                    found.append(f"{relative}:{node.lineno}")
    return found


def test_every_error_answer_goes_through_the_one_writer():
    assert envelope_calls(ROOT) == []


def test_the_scan_sees_an_envelope_call(tmp_path):
    (tmp_path / "models_app").mkdir()
    (tmp_path / "models_app" / "view.py").write_text("body = exc.envelope()\n")
    assert envelope_calls(tmp_path) == ["models_app/view.py:1"]


def test_the_scan_sees_a_hand_built_envelope(tmp_path):
    (tmp_path / "models_app").mkdir()
    (tmp_path / "models_app" / "view.py").write_text(
        'error = {"code": "method_not_allowed", "message": "no", "param": None}\n'
        'body = {"error": {"code": "x"}}\n'
    )
    assert hand_built_envelopes(tmp_path) == ["models_app/view.py:1", "models_app/view.py:2"]


@pytest.mark.parametrize(("exc", "status", "code"), [
    (drf.ParseError("JSON parse error"), 400, "invalid_request"),
    (drf.ValidationError("bad"), 400, "invalid_request"),
    (drf.UnsupportedMediaType("text/plain"), 415, "invalid_request"),
    (drf.MethodNotAllowed("DELETE"), 405, "method_not_allowed"),
    (drf.NotFound(), 404, "not_found"),
    (drf.PermissionDenied(), 403, "forbidden"),
    (drf.NotAcceptable(), 406, "api_error"),
])
def test_drf_exceptions_answer_with_their_status_code_and_detail(exc, status, code):
    response = exception_handler(exc, {"view": None})
    assert response.status_code == status
    assert response.data == {"error": {"code": code, "message": str(exc.detail), "param": None}}
    assert "Retry-After" not in response.headers


def test_a_plain_django_error_answer_carries_retry_after():
    response = error_json_response(RuntimeUnavailable("the runtime did not answer"), {"Cache-Control": "no-cache"})
    assert response.status_code == 503
    assert response["Retry-After"] == "2" and response["Cache-Control"] == "no-cache"


def anthropic_envelope(exc: LLMPoolError) -> dict:
    """A protocol's own error shape, as the Anthropic Messages API answers errors."""
    return {"type": "error", "error": {"type": exc.code, "message": exc.message}}


def test_an_answer_in_a_protocols_own_shape_keeps_the_status_and_headers():
    answer = error_answer(FairnessKeyQueueFull("full"), envelope=anthropic_envelope, headers={"Connection": "close"})
    assert answer.status == 429
    assert answer.body == {"type": "error", "error": {"type": "fairness_key_queue_full", "message": "full"}}
    assert answer.headers == {"Connection": "close", "Retry-After": "1"}


def test_the_default_shape_is_the_envelope_and_401_carries_the_challenge():
    answer = error_answer(InvalidApiKey("no key"))
    assert (answer.status, answer.body) == (401, {"error": {"code": "invalid_api_key", "message": "no key",
                                                            "param": None}})
    assert answer.headers == {"WWW-Authenticate": 'Bearer realm="llm-pool"'}


def test_the_closing_answer_is_whole_http():
    raw = error_answer(RuntimeUnavailable("down"), headers={"Connection": "close"}).http_bytes()
    head, body = raw.split(b"\r\n\r\n")
    assert head.split(b"\r\n") == [b"HTTP/1.1 503 Service Unavailable", b"content-type: application/json",
                                    f"content-length: {len(body)}".encode(), b"connection: close",
                                    b"retry-after: 2"]
    assert body == b'{"error":{"code":"runtime_unavailable","message":"down","param":null}}'


async def _asgi_answer(app, scope: dict, body: bytes = b"") -> tuple[dict, bytes]:
    sent = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    start, *bodies = sent
    return start, b"".join(message.get("body", b"") for message in bodies)


async def test_send_error_writes_the_protocols_envelope_over_asgi():
    async def app(scope, receive, send):
        await send_error(send, FairnessKeyQueueFull("busy"), envelope=anthropic_envelope)

    start, body = await _asgi_answer(app, {"type": "http"})
    assert start["status"] == 429
    assert (b"retry-after", b"1") in start["headers"]
    assert json.loads(body) == {"type": "error", "error": {"type": "fairness_key_queue_full", "message": "busy"}}


async def test_an_inference_app_answers_its_errors_in_its_shape():
    async def create(data, caller):
        raise FairnessKeyQueueFull("busy")

    app = inference_app(create, "/v1/messages", envelope=anthropic_envelope)
    scope = {"type": "http", "method": "GET", "path": "/v1/messages", "headers": []}
    start, body = await _asgi_answer(app, scope)
    assert (start["status"], (b"allow", b"POST") in start["headers"]) == (405, True)
    assert json.loads(body)["type"] == "error"
    assert json.loads(body)["error"]["type"] == "method_not_allowed"
