"""Schemathesis over the live service's own OpenAPI (issue 23): every operation, a bounded and
derandomized number of generated requests, with the admin token sent and not sent, under every
check schemathesis has (the CLI's ``--checks all``): no server error, a documented status, content
type and schema, a request the schema calls valid accepted and one it calls invalid refused, an
undeclared method answered 405.  Endpoints that stream until the client leaves are read with a
bounded read (``BOUNDED_STREAMS``).  Strategies of this suite's own go where the schema cannot
lead the generator: text with a lone UTF-16 surrogate in every field that carries text, stop
sequences around their bounds (docs/api.md, "Limits"), and audio forms that name a configured model."""
from __future__ import annotations

import re
from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import CHECKS, is_check_class, load_all_checks
from schemathesis.specs.openapi.checks import positive_data_acceptance

from models_app.api.audio.protocol import RESPONSE_FORMATS, STREAMED_FORMATS, TRANSCRIPTIONS_PATH, TRANSLATIONS_PATH
from models_app.api.limits import MAX_STOP_LENGTH, MAX_STOP_SEQUENCES
from tests.conftest import LiveService, write_settings

TOKEN = "fuzz-token"
MODELS = {"m": {"backend": "stub", "enabled": True, "embeddings": True}, "cold": {"backend": "stub"}}
EXAMPLES_PER_OPERATION = 12
load_all_checks()
# Rules a schema cannot state: those that tie one field to another, and the limits that hold
# anywhere in a body, free-form objects too (docs/api.md, "Limits").  A request the schema calls
# valid may still be refused for one of them (400, or 422 for a load body); any other refusal of
# such a request fails.
UNSTATED_RULES = [re.compile(rule) for rule in (
    r"^the integer .* is outside the signed 64-bit range$",
    r"^the body is nested deeper than \d+ levels$",
    r"^messages\[\d+\]\.content: Field required$",  # content may be left out on an assistant's turn only
    r"^messages\[\d+\]\.(tool_call_id|tool_calls|content): (a tool message|only an assistant|a tool result)",
    r'^tool_choice "required" needs tools$',
    r"^tool_choice names function .*, which is not one of the tools$",
    r"^tools\[\d+\]: a second function named ",
    r"^top_logprobs needs logprobs: true$",
    # /v1/messages (Anthropic's shapes): which blocks a role's turn may hold, tool_choice against tools
    r'^tool_choice "(any|tool)" needs tools$',
    r"^tool_choice names tool .*, which is not one of the tools$",
    r"^tools\[\d+\]: a second tool named ",
    r"^messages\[\d+\]\.content(\[\d+\])?: (an assistant message has no|a \w+ message has no|a system message is text|a \w+ message needs content|a tool result is text here)",
    r"token_budget and budget_period are set together",  # the keys API (docs/api.md)
    # Ollama's /api/*: which turns carry images and tool calls, images that must be base64 pictures
    r"^messages\[\d+\]\.(images|tool_calls): only an? (user|assistant) message has",
    r"(^|\.)images\[\d+\]: (an image is base64 data|not a PNG, JPEG, GIF or WebP image)$",
    r"^messages\[\d+\]: a user message needs content or images$",
    r"^a raw prompt takes no images or system$",
    # The audio form: which response formats stream and carry timestamp granularities; and every
    # stub model (MODELS) refuses a transcription, since the stub backend cannot transcribe.
    r"^stream is supported with response_format \w+ or \w+ only$",
    r"^timestamp_granularities needs response_format verbose_json$",
    r"^model \w+ does not transcribe audio \(its capabilities\.audio_transcription is false\)$",
)]
# A path that always refuses what it is asked, as its description says: Ollama's model management
# (models are declared in settings.json).
ALWAYS_REFUSED = {"model_management_unsupported"}


def error_message(response) -> str:
    """The message of an error answer: llm-pool's envelope (Anthropic's too) or Ollama's ``{"error": message}``."""
    error = response.json()["error"]
    return error["message"] if isinstance(error, dict) else error


def positive_data_acceptance_but_unstated_rules(ctx, response, case):
    """schemathesis's positive_data_acceptance, but for a refusal by one of ``UNSTATED_RULES``."""
    if response.status_code in (400, 422) and any(rule.search(error_message(response)) for rule in UNSTATED_RULES):
        return None
    if response.status_code == 405 and response.json().get("code") in ALWAYS_REFUSED:
        return None
    return positive_data_acceptance(ctx, response, case)


# Every check schemathesis has (the CLI's --checks all), the data checks among them: a request the
# schema calls valid is not refused (positive_data_acceptance), one it calls invalid is.
ALL_CHECKS = [
    positive_data_acceptance_but_unstated_rules if check is positive_data_acceptance else check
    for check in CHECKS.get_all() if not is_check_class(check)
]
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
            response = case.call_and_validate(base_url=live.url, headers=auth, checks=ALL_CHECKS, timeout=30)
            delete_created_key(live, case, response)


def delete_created_key(live: LiveService, case, response) -> None:
    """A key the keys API made is deleted at once: a key in the database turns the inference key
    check on, and every later inference case would get 401 instead of reaching its body's checks."""
    if case.method == "POST" and case.path == "/v1/admin/keys" and response.status_code == 201:
        deleted = httpx.delete(f"{live.url}/v1/admin/keys/{response.json()['id']}", headers=AUTH[0], timeout=10)
        assert deleted.status_code == 204, deleted.text


# -- the suite's own strategies ------------------------------------------------------------------
# Text around one lone surrogate (st.text holds none, so it cannot pair with a neighbour); JSON
# writes it as a \\udXXX escape.
LONE_SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
TEXT_WITH_A_SURROGATE = st.tuples(st.text(max_size=6), LONE_SURROGATE, st.text(max_size=6)).map("".join)
USER = {"role": "user", "content": "hi"}
# Where text goes: (operation, a body with the text at one place, the param that names that place).
SURROGATE_PLACES = [
    ("/v1/chat/completions", lambda text: {"model": "m", "messages": [{"role": "user", "content": text}]},
     "messages[0].content"),
    ("/v1/chat/completions", lambda text: {"model": "m", "messages": [USER], "stop": [text]}, "stop[0]"),
    ("/v1/chat/completions", lambda text: {"model": "m", "messages": [USER], "user": text}, "user"),
    ("/v1/responses", lambda text: {"model": "m", "input": text}, "input"),
    ("/v1/responses", lambda text: {"model": "m", "input": "hi", "instructions": text}, "instructions"),
    ("/v1/responses", lambda text: {"model": "m", "input": "hi", "metadata": {"k": text}}, "metadata.k"),
    ("/v1/completions", lambda text: {"model": "m", "prompt": text}, "prompt"),
    ("/v1/embeddings", lambda text: {"model": "m", "input": [text]}, "input[0]"),
    ("/v1/admin/models/{model_name}/load", lambda text: {"llama_server_env": {"K": text}}, "llama_server_env.K"),
]


def call(api_schema, live, path: str, body: dict, media_type: str = "application/json"):
    """``body`` sent to ``path`` as schemathesis sends a case, with the admin token, every check run."""
    case = api_schema[path]["POST"].Case(body=body, media_type=media_type,
                                         path_parameters={"model_name": "cold"} if "{model_name}" in path else None)
    COUNTS["requests"] += 1
    return case.call_and_validate(base_url=live.url, headers=AUTH[0], checks=ALL_CHECKS, timeout=30)


@given(place=st.sampled_from(SURROGATE_PLACES), text=TEXT_WITH_A_SURROGATE)
@settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
def test_a_lone_surrogate_anywhere_is_refused_naming_its_field(api_schema, live, place, text):
    path, body, param = place
    answer = call(api_schema, live, path, body(text))
    status, code = (422, "invalid_load_body") if path.startswith("/v1/admin") else (400, "invalid_request")
    error = answer.json()["error"]
    assert (answer.status_code, error["code"], error["param"]) == (status, code, param)


# Stop sequences of the lengths around the bound, as many as around theirs.
STOP_SEQUENCE = st.builds(lambda char, size: char * size, st.characters(exclude_categories=("Cs",)),
                          st.sampled_from([0, 1, 3, MAX_STOP_LENGTH - 1, MAX_STOP_LENGTH, MAX_STOP_LENGTH + 1]))
STOP = st.one_of(STOP_SEQUENCE, st.lists(STOP_SEQUENCE, max_size=MAX_STOP_SEQUENCES + 4))


def refused_stop(stop: str | list[str]) -> str | None:
    """The param a stop past its bounds is refused with (docs/api.md, "Limits"), or None."""
    if isinstance(stop, list) and len(stop) > MAX_STOP_SEQUENCES:
        return "stop"
    sequences = [stop] if isinstance(stop, str) else stop
    over = [index for index, sequence in enumerate(sequences) if len(sequence) > MAX_STOP_LENGTH]
    return None if not over else "stop" if isinstance(stop, str) else f"stop[{over[0]}]"


@given(path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]), stop=STOP)
@settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
def test_stop_sequences_within_the_bounds_run_and_past_them_are_refused(api_schema, live, path, stop):
    body = {"model": "m", "stop": stop, **({"messages": [USER]} if "chat" in path else {"prompt": "hi"})}
    answer = call(api_schema, live, path, body)
    param = refused_stop(stop)
    if param is None:
        assert answer.status_code == 200, answer.text
    else:
        assert (answer.status_code, answer.json()["error"]["param"]) == (400, param), answer.text


@given(path=st.sampled_from([TRANSCRIPTIONS_PATH, TRANSLATIONS_PATH]), model=st.sampled_from(sorted(MODELS)),
       audio=st.binary(min_size=1, max_size=256), response_format=st.sampled_from(RESPONSE_FORMATS),
       stream=st.booleans())
@settings(max_examples=20, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
def test_an_audio_form_to_a_model_that_cannot_transcribe_is_refused_naming_the_model(
        api_schema, live, path, model, audio, response_format, stream):
    """The generated forms seldom name a configured model; these do.  No stub model transcribes,
    loaded (m) or not (cold), streamed or not, whatever the bytes: 400 before anything is sent."""
    form = {"file": audio, "model": model, "response_format": response_format,
            "stream": stream and response_format in STREAMED_FORMATS}
    answer = call(api_schema, live, path, form, media_type="multipart/form-data")
    error = answer.json()["error"]
    assert (answer.status_code, error["code"], error["param"]) == (400, "transcription_unsupported", "model")
