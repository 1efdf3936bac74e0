"""service.admin_token on /v1/admin/*, the OpenAPI schema and the Swagger UI, over real HTTP."""
from __future__ import annotations

import httpx
import pytest

from models_app.api.routes import INFERENCE_ROUTES
from runtime.config import LoadBody
from tests.api.test_admin_models import ENTRY_KEYS
from tests.conftest import LiveService, write_settings

TOKEN = "s3cret-admin-token"
RIGHT = {"Authorization": f"Bearer {TOKEN}"}

ADMIN_CALLS = [
    ("GET", "/v1/admin/models"),
    ("GET", "/v1/admin/gpu-memory"),
    ("POST", "/v1/admin/settings/reload"),
    ("POST", "/v1/admin/models/echo/load"),
    ("POST", "/v1/admin/models/echo/unload"),
    ("GET", "/v1/admin/keys"),
]
# Every path of the contract, as the OpenAPI schema names them.
CONTRACT_PATHS = {
    "/v1/admin/models": {"get"},
    "/v1/admin/gpu-memory": {"get"},
    "/v1/admin/settings/reload": {"post"},
    "/v1/admin/models/{model_name}/load": {"post"},
    "/v1/admin/models/{model_name}/unload": {"post"},
    "/v1/responses": {"post"},
}
HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    folder = tmp_path_factory.mktemp("auth")
    settings_path = write_settings(folder, {"echo": {"backend": "stub"}}, service={"admin_token": TOKEN})
    live = LiveService(settings_path, folder / "db.sqlite3").start()
    yield live
    assert live.stop() == 0


def state(http: httpx.Client) -> str:
    return http.get("/v1/admin/models", headers=RIGHT).json()["models"][0]["runtime_state"]


def assert_unauthorized(answer: httpx.Response) -> None:
    assert answer.status_code == 401, answer.text
    assert answer.json() == {"error": {"code": "unauthorized", "message": answer.json()["error"]["message"],
                                       "param": None}}
    assert answer.json()["error"]["message"]
    assert answer.headers["WWW-Authenticate"].startswith("Bearer")


# ---- the admin token -----------------------------------------------------------------------

WRONG_HEADERS = {
    "missing": {},
    "basic-scheme": {"Authorization": f"Basic {TOKEN}"},
    "token-scheme": {"Authorization": f"Token {TOKEN}"},
    "bare-token": {"Authorization": TOKEN},
    "wrong-token": {"Authorization": "Bearer not-the-token"},
    "token-prefix": {"Authorization": f"Bearer {TOKEN[:-1]}"},
    "token-extended": {"Authorization": f"Bearer {TOKEN}x"},
    "bearer-only": {"Authorization": "Bearer"},
}


@pytest.mark.parametrize("method, path", ADMIN_CALLS, ids=[p for _, p in ADMIN_CALLS])
@pytest.mark.parametrize("headers", list(WRONG_HEADERS.values()), ids=list(WRONG_HEADERS))
def test_admin_calls_without_the_right_token_are_401(http, method, path, headers):
    assert_unauthorized(http.request(method, path, headers=headers))


def test_an_unauthorized_load_changes_nothing(http):
    assert_unauthorized(http.post("/v1/admin/models/echo/load"))
    assert state(http) == "unloaded"


@pytest.mark.parametrize("method, path", ADMIN_CALLS, ids=[p for _, p in ADMIN_CALLS])
def test_admin_calls_with_the_right_token_are_answered(http, method, path):
    answer = http.request(method, path, headers=RIGHT)
    assert answer.status_code == 200, answer.text


def test_responses_are_not_behind_the_admin_token(http):
    assert http.post("/v1/admin/models/echo/load", headers=RIGHT).json()["runtime_state"] == "loaded"
    try:
        answer = http.post("/v1/responses", json={"model": "echo", "input": "no token needed"})
        assert answer.status_code == 200
        assert answer.json()["output"][0]["content"][0]["text"] == "no token needed"
        # A wrong admin token does not matter there either.
        wrong = http.post("/v1/responses", json={"model": "echo", "input": "x"}, headers={"Authorization": "Bearer no"})
        assert wrong.status_code == 200
    finally:
        assert http.post("/v1/admin/models/echo/unload", headers=RIGHT).json()["runtime_state"] == "unloaded"
    # Unloaded, the answer is the lifecycle error, not 401.
    rejected = http.post("/v1/responses", json={"model": "echo", "input": "x"})
    assert (rejected.status_code, rejected.json()["error"]["code"]) == (409, "model_not_loaded")


def test_admin_calls_are_open_without_a_configured_token(live_service):
    open_service = live_service({"echo": {"backend": "stub"}})
    with open_service.client() as client:
        assert client.get("/v1/admin/models").status_code == 200
        assert client.get("/v1/admin/models", headers={"Authorization": "Bearer anything"}).status_code == 200


# ---- OpenAPI and Swagger UI ----------------------------------------------------------------


@pytest.fixture(scope="module")
def schema(service) -> dict:
    answer = httpx.get(service.url + "/v1/openapi.json", timeout=15)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith(("application/json", "application/vnd.oai.openapi+json"))
    return answer.json()


def test_openapi_lists_every_admin_path_and_responses(schema):
    assert schema["openapi"].startswith("3.")
    paths = schema["paths"]
    for path, methods in CONTRACT_PATHS.items():
        assert path in paths, path
        assert methods <= set(paths[path]), path


def test_every_operation_has_a_description(schema):
    operations = [
        (path, method, operation)
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        if method in HTTP_METHODS
    ]
    assert len(operations) >= len(CONTRACT_PATHS)
    for path, method, operation in operations:
        assert isinstance(operation.get("description"), str) and operation["description"].strip(), (method, path)


def test_openapi_documents_the_admin_error_responses(schema):
    load = schema["paths"]["/v1/admin/models/{model_name}/load"]["post"]["responses"]
    assert {"200", "400", "401", "404", "409", "422"} <= set(load)
    unload = schema["paths"]["/v1/admin/models/{model_name}/unload"]["post"]["responses"]
    assert {"200", "404", "409"} <= set(unload)
    reload = schema["paths"]["/v1/admin/settings/reload"]["post"]["responses"]
    assert {"200", "400", "409"} <= set(reload)


def test_the_admin_model_entry_schema_has_every_spec_field(schema):
    load_200 = schema["paths"]["/v1/admin/models/{model_name}/load"]["post"]["responses"]["200"]
    reference = load_200["content"]["application/json"]["schema"]["$ref"]
    component = schema["components"]["schemas"][reference.rsplit("/", 1)[-1]]
    assert set(component["properties"]) == ENTRY_KEYS


def test_the_load_body_schema_lists_every_declared_override(schema):
    body = schema["paths"]["/v1/admin/models/{model_name}/load"]["post"]["requestBody"]
    properties = body["content"]["application/json"]["schema"]["properties"]
    assert set(properties) == set(LoadBody.model_fields)
    assert properties["gguf_n_ctx"] == {"type": "integer", "minimum": 1, "maximum": 2**63 - 1, "nullable": True}
    assert properties["sglang_chunked_prefill_size"]["minimum"] == -1


def test_every_inference_path_is_documented_in_its_protocols_shapes(schema):
    """Every Ollama and Anthropic route and the token counts: GET paths without a body, NDJSON
    streams and Ollama's {"error"} on /api/*, the sampling knobs in their bodies."""
    paths = schema["paths"]
    client_paths = {path for path in INFERENCE_ROUTES
                    if path.startswith(("/api/", "/v1/messages")) or path.endswith("/input_tokens")}
    assert len(client_paths) == 17 and client_paths <= set(paths)
    assert set(paths["/api/tags"]) == {"get"} and "requestBody" not in paths["/api/tags"]["get"]
    assert set(paths["/api/delete"]) == {"delete"}
    chat = paths["/api/chat"]["post"]
    assert set(chat["responses"]["200"]["content"]) == {"application/json", "application/x-ndjson"}
    assert chat["responses"]["404"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/OllamaError"}
    assert schema["components"]["schemas"]["OllamaError"]["required"] == ["error", "code"]
    options = chat["requestBody"]["content"]["application/json"]["schema"]["properties"]["options"]["properties"]
    assert {"num_predict", "top_k", "repeat_penalty", "seed"} <= set(options)
    messages = paths["/v1/messages"]["post"]
    assert set(messages["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert messages["responses"]["404"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/AnthropicError"}
    assert "not_found_error" in schema["components"]["schemas"]["AnthropicError"]["properties"]["error"]["properties"][
        "type"]["enum"]
    top_k = messages["requestBody"]["content"]["application/json"]["schema"]["properties"]["top_k"]
    assert top_k == {"type": "integer", "minimum": 0, "maximum": 2**31 - 1, "nullable": True, "default": None}
    assert "requestBody" in paths["/v1/chat/completions/input_tokens"]["post"]


def test_the_audio_paths_are_documented_with_their_multipart_form(schema):
    """Both audio paths: the form as the parser takes it (a binary file and a model required, no
    other field), every content type an answer may have, 413 for an upload over the bound."""
    for path in ("/v1/audio/transcriptions", "/v1/audio/translations"):
        operation = schema["paths"][path]["post"]
        assert set(operation["requestBody"]["content"]) == {"multipart/form-data"}, path
        form = operation["requestBody"]["content"]["multipart/form-data"]["schema"]
        assert (form["required"], form["additionalProperties"]) == (["file", "model"], False)
        assert form["properties"]["file"]["format"] == "binary"
        assert form["properties"]["response_format"]["enum"] == ["json", "text", "srt", "vtt", "verbose_json"]
        assert form["properties"]["timestamp_granularities[]"]["items"]["enum"] == ["segment", "word"]
        assert (form["properties"]["temperature"]["minimum"], form["properties"]["temperature"]["maximum"]) == (0, 1)
        assert set(operation["responses"]["200"]["content"]) == {"application/json", "text/plain", "text/vtt",
                                                                 "text/event-stream"}
        assert {"400", "401", "403", "404", "413", "429"} <= set(operation["responses"])
        assert "transcription_unsupported" in operation["description"]


def test_every_operation_answers_its_own_schema_component(schema):
    """Three views each have an ``OutputSerializer``; each must be its own component."""
    def answer_component(path: str, method: str) -> str:
        ok = schema["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
        return ok["$ref"].rsplit("/", 1)[-1]

    components = {
        answer_component("/v1/admin/models", "get"),
        answer_component("/v1/admin/gpu-memory", "get"),
        answer_component("/v1/admin/settings/reload", "post"),
    }
    assert len(components) == 3
    assert "gpus" in schema["components"]["schemas"][answer_component("/v1/admin/gpu-memory", "get")]["properties"]


def test_swagger_ui_is_served_at_docs(service):
    answer = httpx.get(service.url + "/docs", timeout=15)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/html")
    assert "swagger" in answer.text.lower()
    assert "/v1/openapi.json" in answer.text
