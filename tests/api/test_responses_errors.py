"""Every POST /v1/responses error code: its HTTP status, the envelope, Retry-After, and no state change."""
from __future__ import annotations

import json
import threading
from contextlib import ExitStack

import httpx
import pytest

from tests.conftest import LiveService, model_entry, wait_until, write_settings

SLOW_REPLY = " ".join(f"w{i}" for i in range(60))  # 60 tokens x 100 ms: outlasts every test that holds one
TEXT_FORMAT = {"type": "json_schema", "name": "answer", "schema": {"type": "object"}, "strict": True}
MODELS = {
    "echo": {"backend": "stub"},
    "cold": {"backend": "stub"},
    "broken": {"backend": "stub", "stub_fail_load": "weights missing"},
    "vision": {"backend": "stub", "modalities": ["text", "image"]},
    "filer": {"backend": "stub", "file_inputs": True},
    "thinker": {"backend": "stub", "thinking_modes": ["default", "enabled", "disabled"]},
    "structured": {"backend": "stub", "response_formats": ["text", "json_schema"]},
    "single": {"backend": "stub", "multi_turn": False},
    "remote": {"backend": "stub", "stub_remote": True},
    "slowload": {"backend": "stub", "stub_load_seconds": 2},
    "draining": {"backend": "stub", "stub_reply": SLOW_REPLY, "stub_token_delay_ms": 100},
    "flaky": {"backend": "stub", "stub_reply": "a b c d", "stub_fail_after_tokens": 2},
    # Wedged: 60 tokens x 100 ms against a 0.5 s limit.
    "wedged": {"backend": "stub", "stub_reply": SLOW_REPLY, "stub_token_delay_ms": 100, "request_timeout_seconds": 0.5},
}
LOADED_AT_START = [name for name in MODELS if name not in ("cold", "slowload")]
IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
FILE = {"type": "input_file", "filename": "notes.txt", "file_data": "data:text/plain;base64,aGk="}


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    folder = tmp_path_factory.mktemp("responses_errors")
    settings = write_settings(folder, MODELS, service={"allow_remote_execution": True})
    live = LiveService(settings, folder / "db.sqlite3").start()
    try:
        with live.client() as http:
            for name in LOADED_AT_START:
                assert http.post(f"/v1/admin/models/{name}/load").status_code == 200
        yield live
    finally:
        live.stop()


def respond(http, model: str, input="hello", **fields) -> httpx.Response:
    return http.post("/v1/responses", json={"model": model, "input": input, **fields})


def assert_error(response: httpx.Response, status: int, code: str, *, param=None, retry_after: bool = False) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert list(body) == ["error"]
    error = body["error"]
    assert set(error) == {"code", "message", "param"}
    assert error["code"] == code
    assert isinstance(error["message"], str) and error["message"]
    assert error["param"] == param
    if retry_after:
        assert int(response.headers["Retry-After"]) > 0
    else:
        assert "Retry-After" not in response.headers
    return error


def assert_served(response: httpx.Response) -> None:
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "completed"


class Unchanged:
    """The admin entry of a model is the same after the block as before it, but for its
    ``stats``: the activity figures count a refused request (that is observation, not state)."""

    def __init__(self, http, name: str):
        self.http, self.name = http, name

    def _state(self) -> dict:
        return {key: value for key, value in model_entry(self.http, self.name).items() if key != "stats"}

    def __enter__(self):
        self.before = self._state()
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            assert self._state() == self.before


def post_in_thread(url: str, json: dict) -> tuple[threading.Thread, list]:
    """POST from a background thread (for calls that block); the response lands in the returned list."""
    result: list = []

    def run():
        result.append(httpx.post(url, json=json, timeout=30))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


# ---- model selection and state -------------------------------------------------------


def test_unknown_model_is_404(http):
    error = assert_error(respond(http, "no-such-model"), 404, "unknown_model", param="model")
    assert "no-such-model" in error["message"]


def test_unloaded_model_is_409_model_not_loaded(http):
    with Unchanged(http, "cold"):
        assert_error(respond(http, "cold"), 409, "model_not_loaded")
    assert model_entry(http, "cold")["runtime_state"] == "unloaded"


def test_failed_model_is_409_model_failed(http):
    with Unchanged(http, "broken") as unchanged:
        error = assert_error(respond(http, "broken"), 409, "model_failed")
    assert unchanged.before["runtime_state"] == "failed"
    # The caller learns where the reason is; the reason itself is the operator's.
    assert "last_error" in error["message"] and "weights missing" not in error["message"]
    assert "weights missing" in unchanged.before["last_error"]


def test_loading_model_is_503_with_retry_after(service, http):
    loader, loaded = post_in_thread(service.url + "/v1/admin/models/slowload/load", {})
    assert wait_until(lambda: model_entry(http, "slowload")["runtime_state"] == "loading")
    assert_error(respond(http, "slowload"), 503, "model_loading", retry_after=True)
    loader.join(timeout=30)
    assert loaded[0].json()["runtime_state"] == "loaded"
    assert_served(respond(http, "slowload"))


def test_unloading_model_is_503_with_retry_after(service, http):
    """Unload waits for the active request; meanwhile the queued one and any new one get model_unloading."""
    with http.stream("POST", "/v1/responses", json={"model": "draining", "input": "x", "stream": True}) as active:
        assert active.status_code == 200
        queued, queued_answer = post_in_thread(service.url + "/v1/responses", {"model": "draining", "input": "x"})
        assert wait_until(lambda: model_entry(http, "draining")["queue_depth"] == 1)
        unloader, unloaded = post_in_thread(service.url + "/v1/admin/models/draining/unload", {})
        assert wait_until(lambda: model_entry(http, "draining")["runtime_state"] == "unloading")
        assert_error(respond(http, "draining"), 503, "model_unloading", retry_after=True)
        queued.join(timeout=30)
        assert_error(queued_answer[0], 503, "model_unloading", retry_after=True)
        assert unloader.is_alive()  # still draining the active request
    unloader.join(timeout=30)
    assert unloaded[0].json()["runtime_state"] == "unloaded"
    assert_error(respond(http, "draining"), 409, "model_not_loaded")


# ---- request validation --------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        pytest.param({"input": "hello"}, "model", id="missing-model"),
        pytest.param({"model": "echo", "input": "hello", "temperature": 5}, "temperature", id="temperature-5"),
        pytest.param({"model": "echo", "input": "hello", "top_p": 0}, "top_p", id="top_p-0"),
        pytest.param({"model": "echo", "input": "hello", "max_output_tokens": 0}, "max_output_tokens", id="max-0"),
        pytest.param({"model": "echo", "input": "hello", "bogus": 1}, "bogus", id="unknown-field"),
        pytest.param({"model": "echo", "input": []}, "input", id="empty-input"),
        pytest.param({"model": "echo"}, "input", id="missing-input"),
        pytest.param({"model": "echo", "input": 5}, "input", id="input-not-text-or-list"),
        pytest.param({"model": "echo", "input": [{"role": "robot", "content": "x"}]}, "input[0].role", id="bad-role"),
        pytest.param(
            {"model": "echo", "input": [{"role": "user", "content": [{"type": "input_text"}]}]},
            "input[0].content[0].text",
            id="part-without-text",
        ),
        pytest.param(
            {"model": "echo", "input": [{"role": "user", "content": [{"type": "input_video", "url": "v"}]}]},
            "input[0].content[0]",
            id="unknown-part-type",
        ),
        pytest.param(
            {"model": "echo", "input": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
            "input",
            id="ends-with-assistant",
        ),
        pytest.param({"model": "echo", "input": "hi", "thinking": "maybe"}, "thinking", id="bad-thinking"),
    ],
)
def test_invalid_body_is_400_invalid_request(http, body, param):
    with Unchanged(http, "echo"):
        assert_error(http.post("/v1/responses", json=body), 400, "invalid_request", param=param)


def test_non_json_body_is_400_invalid_request(http):
    with Unchanged(http, "echo"):
        answer = http.post("/v1/responses", content=b'{"model": "echo", ', headers={"Content-Type": "application/json"})
        assert_error(answer, 400, "invalid_request")


def test_a_json_body_that_is_not_an_object_is_400_invalid_request(http):
    assert_error(http.post("/v1/responses", json=["echo", "hello"]), 400, "invalid_request")


# ---- capabilities --------------------------------------------------------------------


def test_file_input_on_a_model_without_file_inputs_is_400(http):
    content = [{"type": "input_text", "text": "summarise"}, FILE]
    with Unchanged(http, "echo"):
        error = assert_error(
            respond(http, "echo", [{"role": "user", "content": content}]), 400, "file_input_unsupported", param="input"
        )
    assert "echo" in error["message"]
    assert_served(respond(http, "filer", [{"role": "user", "content": content}]))


def test_image_on_a_text_only_model_is_400_modality_unsupported(http):
    content = [{"type": "input_text", "text": "what is this"}, IMAGE]
    with Unchanged(http, "echo"):
        assert_error(
            respond(http, "echo", [{"role": "user", "content": content}]), 400, "modality_unsupported", param="input"
        )
    assert_served(respond(http, "vision", [{"role": "user", "content": content}]))


def test_audio_on_a_text_and_image_model_is_400_modality_unsupported(http):
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    assert_error(respond(http, "vision", [{"role": "user", "content": [audio]}]), 400, "modality_unsupported",
                 param="input")


@pytest.mark.parametrize("mode", ["enabled", "disabled"])
def test_thinking_on_a_default_only_model_is_400(http, mode):
    with Unchanged(http, "echo"):
        assert_error(respond(http, "echo", thinking=mode), 400, "thinking_unsupported", param="thinking")
    assert_served(respond(http, "thinker", thinking=mode))


def test_thinking_default_is_accepted_everywhere(http):
    assert_served(respond(http, "echo", thinking="default"))


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"response_format": {"type": "json_schema", "schema": {"type": "object"}}}, id="response_format"),
        pytest.param({"text": {"format": TEXT_FORMAT}}, id="text.format"),
    ],
)
def test_json_schema_on_a_model_without_it_is_400(http, fields):
    with Unchanged(http, "echo"):
        assert_error(respond(http, "echo", **fields), 400, "response_format_unsupported", param="response_format")
    assert_served(respond(http, "structured", **fields))


def test_json_schema_with_stream_is_400_even_where_supported(http):
    with Unchanged(http, "structured"):
        answer = respond(http, "structured", stream=True, text={"format": TEXT_FORMAT})
        assert_error(answer, 400, "response_format_unsupported", param="response_format")


def test_text_format_is_accepted_everywhere(http):
    assert_served(respond(http, "echo", text={"format": {"type": "text"}}))


def test_two_user_turns_on_a_single_turn_model_is_400(http):
    turns = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "reply"},
        {"role": "user", "content": "second"},
    ]
    with Unchanged(http, "single"):
        assert_error(respond(http, "single", turns), 400, "multi_turn_unsupported", param="input")
    assert_served(respond(http, "echo", turns))
    single_turn = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "only"}]
    assert_served(respond(http, "single", single_turn))


def test_backend_failure_without_stream_is_502_backend_error(http):
    assert_error(respond(http, "flaky"), 502, "backend_error")
    assert model_entry(http, "flaky")["runtime_inflight"] == 0


def test_request_timeout_without_stream_is_504_and_frees_the_slot(http):
    error = assert_error(respond(http, "wedged"), 504, "request_timeout")
    assert "request_timeout_seconds=0.5" in error["message"]
    assert model_entry(http, "wedged")["runtime_inflight"] == 0
    assert model_entry(http, "wedged")["runtime_state"] == "loaded"


def test_request_timeout_mid_stream_ends_with_a_request_timeout_error_event(http):
    body = {"model": "wedged", "input": "x", "stream": True}
    with http.stream("POST", "/v1/responses", json=body) as stream:
        assert stream.status_code == 200
        lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
    last = json.loads(lines[-1].removeprefix("data: "))
    assert (last["type"], last["code"], last["error"]["code"]) == ("error", "request_timeout", "request_timeout")
    assert sum('"response.output_text.delta"' in line for line in lines) >= 2  # it did stream before
    assert wait_until(lambda: model_entry(http, "wedged")["runtime_inflight"] == 0)


# ---- remote execution ----------------------------------------------------------------


def test_remote_model_is_accepted_when_remote_execution_is_allowed(http):
    assert_served(respond(http, "remote"))


@pytest.fixture(scope="module")
def restricted_service(tmp_path_factory, api_shape):
    """No remote execution; one replica running one request, at most one waiting per key and two in all."""
    folder = tmp_path_factory.mktemp("restricted")
    models = {
        "slow": {"backend": "stub", "stub_reply": SLOW_REPLY, "stub_token_delay_ms": 100, "replicas": 1},
        "remote": {"backend": "stub", "stub_remote": True},
        "local": {"backend": "stub"},
    }
    settings = write_settings(
        folder,
        models,
        service={"allow_remote_execution": False},
        engine={"fairness": {"per_key_queue_limit": 1, "executor_queue_limit": 2}},
    )
    live = LiveService(settings, folder / "db.sqlite3").start()
    try:
        with live.client() as http:
            for name in models:
                assert http.post(f"/v1/admin/models/{name}/load").json()["runtime_state"] == "loaded"
        yield live
    finally:
        live.stop()


def test_remote_model_with_remote_execution_disallowed_is_403(restricted_service):
    with restricted_service.client() as http:
        with Unchanged(http, "remote"):
            error = assert_error(respond(http, "remote"), 403, "remote_execution_disallowed")
        assert "allow_remote_execution" in error["message"]
        assert_served(respond(http, "local"))


# ---- queue limits --------------------------------------------------------------------



def open_streams(stack: ExitStack, http, keys: list[str]) -> None:
    """Admit one streamed request per key, in order (the answer's headers mean it was admitted)."""
    for key in keys:
        body = {"model": "slow", "input": "x", "stream": True, "user": key}
        assert stack.enter_context(http.stream("POST", "/v1/responses", json=body)).status_code == 200


def assert_queue_drains(http) -> None:
    assert wait_until(lambda: model_entry(http, "slow")["inflight_requests"] == 0)
    assert respond(http, "slow", max_output_tokens=1).json()["output"][0]["content"][0]["text"] == "w0"
    assert model_entry(http, "slow")["runtime_state"] == "loaded"


def test_full_key_queue_is_429_fairness_key_queue_full(restricted_service):
    with restricted_service.client() as http:
        counters = model_entry(http, "slow")["fairness"]
        with ExitStack() as streams:
            open_streams(streams, http, ["k1", "k1"])  # the first runs, the second waits
            entry = model_entry(http, "slow")
            assert (entry["runtime_inflight"], entry["queue_depth"]) == (1, 1)
            assert_error(respond(http, "slow", user="k1"), 429, "fairness_key_queue_full", retry_after=True)
            after = model_entry(http, "slow")
            assert after["fairness"]["rejected_per_key_limit"] == counters["rejected_per_key_limit"] + 1
            assert after["fairness"]["rejected_executor_limit"] == counters["rejected_executor_limit"]
            assert next(k for k in after["fairness"]["keys"] if k["key"] == "k1")["rejected"] == 1
            assert after == {**entry, "fairness": after["fairness"], "stats": after["stats"]}  # stats count the refusal
            open_streams(streams, http, ["k2"])  # another key still gets in
            assert model_entry(http, "slow")["queue_depth"] == 2
        assert_queue_drains(http)


def test_full_model_queue_is_429_executor_queue_full(restricted_service):
    with restricted_service.client() as http:
        counters = model_entry(http, "slow")["fairness"]
        with ExitStack() as streams:
            open_streams(streams, http, ["e1", "e2", "e3"])  # e1 runs, e2 and e3 wait: the queue is full
            entry = model_entry(http, "slow")
            assert (entry["runtime_inflight"], entry["queue_depth"]) == (1, 2)
            assert_error(respond(http, "slow", user="e4"), 429, "executor_queue_full", retry_after=True)
            after = model_entry(http, "slow")
            assert after["fairness"]["rejected_executor_limit"] == counters["rejected_executor_limit"] + 1
            assert after["fairness"]["rejected_per_key_limit"] == counters["rejected_per_key_limit"]
            rejected = {k["key"]: k["rejected"] for k in after["fairness"]["keys"]}
            assert (rejected["e1"], rejected["e2"], rejected["e3"], rejected["e4"]) == (0, 0, 0, 1)
            assert after == {**entry, "fairness": after["fairness"], "stats": after["stats"]}  # stats count the refusal
        assert_queue_drains(http)
