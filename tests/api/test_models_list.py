"""GET /v1/models and /v1/models/{id} in the OpenAI shape (the official client, its own types), the
service.list_models setting, and the JSON 404 of every unknown path under /v1."""
from __future__ import annotations

import openai
import pytest
from openai.types import Model

from tests.conftest import LiveService, write_settings

MODELS = {
    "fixed": {"backend": "stub", "stub_reply": "hello"},
    "vision": {"backend": "stub", "modalities": ["text", "image"]},
    "cold": {"backend": "stub"},
}
LOADED = ["fixed", "vision"]


def start(folder, service: dict | None = None) -> LiveService:
    live = LiveService(write_settings(folder, MODELS, service=service), folder / "db.sqlite3").start()
    with live.client() as http:
        for name in LOADED:
            assert http.post(f"/v1/admin/models/{name}/load").status_code == 200
    return live


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    live = start(tmp_path_factory.mktemp("models_list"))
    yield live
    live.stop()


@pytest.fixture
def client(service):
    with openai.OpenAI(base_url=service.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def strict_model(data: dict) -> Model:
    model = Model.model_validate(data, strict=True)
    assert model.object == "model" and model.owned_by == "llm-pool"
    return model


def test_the_list_has_the_openai_shape_and_every_configured_model(http):
    answer = http.get("/v1/models")
    assert answer.status_code == 200
    body = answer.json()
    assert body["object"] == "list"
    assert [item["id"] for item in body["data"]] == list(MODELS)
    for item in body["data"]:
        strict_model(item)
        assert set(item) == {"id", "object", "created", "owned_by", "runtime_state", "backend", "capabilities", "context_length",
                             "node"}
        assert item["backend"] == "stub"
    states = {item["id"]: item["runtime_state"] for item in body["data"]}
    assert states == {"fixed": "loaded", "vision": "loaded", "cold": "unloaded"}
    vision = next(item for item in body["data"] if item["id"] == "vision")
    assert vision["capabilities"]["modalities"] == ["text", "image"]


def test_the_openai_client_lists_and_retrieves(client):
    listed = list(client.models.list())
    assert [model.id for model in listed] == list(MODELS)
    assert all(isinstance(model, Model) for model in listed)
    retrieved = client.models.retrieve("cold")
    assert retrieved.id == "cold"
    assert retrieved.created == listed[0].created
    assert retrieved.model_extra["runtime_state"] == "unloaded"


def test_retrieve_answers_one_model_in_the_same_shape(http):
    answer = http.get("/v1/models/fixed")
    assert answer.status_code == 200
    listed = next(item for item in http.get("/v1/models").json()["data"] if item["id"] == "fixed")
    assert answer.json() == listed
    strict_model(answer.json())


def test_retrieve_an_unknown_model_is_404_unknown_model(http, client):
    answer = http.get("/v1/models/no-such-model")
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "unknown_model"
    assert answer.json()["error"]["param"] == "model"
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("no-such-model")
    assert caught.value.code == "unknown_model"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/nothing-here"),
        ("POST", "/v1/completions/extra"),
        ("GET", "/v1"),
        ("GET", "/v1/admin/models/"),
        ("DELETE", "/v1/models/fixed/deeper"),
    ],
)
def test_unknown_paths_under_v1_are_the_json_404_envelope(http, method, path):
    answer = http.request(method, path)
    assert answer.status_code == 404
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {"error": {"code": "not_found", "message": f"no endpoint at {path}", "param": None}}


def test_an_unknown_path_through_the_openai_client_is_not_found_error(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.get("/no-such-endpoint", cast_to=object)
    assert caught.value.code == "not_found"


def test_list_models_loaded_lists_only_the_loaded(tmp_path):
    live = start(tmp_path, service={"list_models": "loaded"})
    try:
        with live.client() as http:
            assert [item["id"] for item in http.get("/v1/models").json()["data"]] == LOADED
            # Retrieve still answers every configured model, with its state.
            assert http.get("/v1/models/cold").json()["runtime_state"] == "unloaded"
            assert http.post("/v1/admin/models/fixed/unload").json()["runtime_state"] == "unloaded"
            assert [item["id"] for item in http.get("/v1/models").json()["data"]] == ["vision"]
    finally:
        live.stop()


def test_list_models_refuses_other_values(tmp_path):
    from runtime.config import ServiceSettings

    with pytest.raises(ValueError, match="list_models"):
        ServiceSettings.model_validate({"list_models": "some"})
