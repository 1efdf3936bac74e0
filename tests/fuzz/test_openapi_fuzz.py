"""Schemathesis over the live service's own OpenAPI (issue 23): every operation, a bounded and
derandomized number of generated requests, with the admin token sent and not sent.  Each answer
must be no server error, one of the operation's documented statuses, of a documented content
type, and match the documented schema.  Endpoints that stream until the client leaves are read
with a bounded read (``BOUNDED_STREAMS``)."""
from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.conftest import LiveService, write_settings

TOKEN = "fuzz-token"
MODELS = {"m": {"backend": "stub", "enabled": True, "embeddings": True}, "cold": {"backend": "stub"}}
EXAMPLES_PER_OPERATION = 12
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# Streams that end only when the client leaves (the logs with ?follow=true): read their head,
# then leave; the documented statuses of their GET.
BOUNDED_STREAMS = {"/v1/admin/events": {200, 400, 401, 404}, "/v1/admin/models/{model_name}/logs": {200, 400, 401, 404, 503}}
COUNTS: Counter = Counter()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    service = LiveService(write_settings(folder, MODELS, service={"admin_token": TOKEN}), folder / "db.sqlite3",
                          mode="embedded").start()
    yield service
    assert service.stop() == 0
    operations = sorted(key for key in COUNTS if key.startswith("operation "))
    print(f"\nfuzz: {len(operations)} operations, {COUNTS['requests']} requests")


@pytest.fixture(scope="module")
def api_schema(live):
    return schemathesis.openapi.from_url(live.url + "/v1/openapi.json")


# Each generated request is sent with the admin token and without it.
AUTH = ({"Authorization": f"Bearer {TOKEN}"}, {})


schema = schemathesis.pytest.from_fixture("api_schema")


def bounded_stream(live: LiveService, case, headers: dict) -> None:
    """The documented answers of an endless stream, read only as far as its first bytes."""
    with httpx.stream(case.method, live.url + case.formatted_path, params=case.query, headers=headers,
                      timeout=10) as answer:
        # Another method (schemathesis tries them): 405, or 401 first without the token.
        expected = {"GET": BOUNDED_STREAMS[case.path], "OPTIONS": {200, 401}}.get(case.method, {401, 405})
        assert answer.status_code in expected, (case.method, case.query, answer.status_code)
        kind = answer.headers["content-type"].split(";")[0]
        # ?format=event-stream renders an error as one SSE error event too (the view's renderers).
        assert kind in ({"text/event-stream"} if answer.status_code == 200 and case.method == "GET"
                        else {"application/json", "text/event-stream"}), (case.query, kind)
        assert next(answer.iter_raw(), b"")  # its first bytes came; then leave


@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, derandomize=True, deadline=None,
          suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_documented(case, live):
    COUNTS[f"operation {case.operation.label}"] += 1
    for auth in AUTH:
        COUNTS["requests"] += 1
        if case.path in BOUNDED_STREAMS:
            bounded_stream(live, case, {**(case.headers or {}), **auth})
        else:
            case.call_and_validate(base_url=live.url, headers=auth, checks=CHECKS, timeout=30)
