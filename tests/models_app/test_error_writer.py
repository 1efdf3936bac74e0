"""One writer of the error envelope (``LLMPoolError.envelope()`` in runtime/errors.py), and DRF's
own exceptions answered through it with the codes and statuses docs/api.md lists."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from rest_framework import exceptions as drf

from models_app.api.errors import error_json_response, exception_handler
from runtime.errors import RuntimeUnavailable

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("models_app", "llmpool", "runtime")
THE_WRITER = Path("runtime/errors.py")
ENVELOPE_FIELDS = {"code", "message", "param"}


def _is_schema(node: ast.Dict) -> bool:
    """A dict of serializer fields (``{"code": serializers.CharField(), ...}``) declares the
    envelope's OpenAPI schema; it writes no answer."""
    return all(isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
               and isinstance(value.func.value, ast.Name) and value.func.value.id == "serializers"
               for value in node.values)


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
