"""The ``adapters`` definition field (runtime.backends.shared.adapters): which backends take it,
what a valid declaration is, and that every adapter id and alias is a name of its own; the
``adapters_loaded`` override of llama_cpp, vllm and vllm_serve."""
import pytest

from runtime.backends import BACKENDS
from runtime.backends.shared.adapters import ADAPTERS_LOADED
from runtime.config import validate_settings
from runtime.errors import InvalidLoadRequest, InvalidSettings

GGUF = {"backend": "llama_cpp", "model_path": "base.gguf"}


def problems(models: dict) -> list[dict]:
    with pytest.raises(InvalidSettings) as caught:
        validate_settings({"models": models})
    assert caught.value.code == "invalid_settings"
    return caught.value.details


@pytest.mark.parametrize("definition", [
    GGUF,
    {"backend": "llama_server", "model_path": "base.gguf"},
    {"backend": "vllm", "model_path": "org/base"},
    {"backend": "vllm_serve", "model_path": "org/base"},
])
def test_the_four_backends_declare_adapters_with_a_default_scale_of_one(definition):
    settings = validate_settings({"models": {"m": {**definition, "adapters": {"sql": {"path": "sql"}}}}})
    adapter = settings.models["m"].adapters["sql"]
    assert (adapter.path, adapter.scale, adapter.aliases) == ("sql", 1.0, [])


def test_other_backends_refuse_the_field():
    details = problems({"m": {"backend": "stub", "adapters": {"sql": {"path": "sql.gguf"}}}})
    assert [p["path"] for p in details] == ["$.models.m.adapters"]


@pytest.mark.parametrize("adapters, path", [
    ({"bad:name": {"path": "a.gguf"}}, "$.models.m.adapters.bad:name.[key]"),  # no ":" in an adapter's name
    ({"sql": {}}, "$.models.m.adapters.sql.path"),
    ({"sql": {"path": ""}}, "$.models.m.adapters.sql.path"),
    ({"sql": {"path": "a.gguf", "scale": 9}}, "$.models.m.adapters.sql.scale"),
    ({"sql": {"path": "a.gguf", "scale": "1"}}, "$.models.m.adapters.sql.scale"),
    ({"sql": {"path": "a.gguf", "rank": 4}}, "$.models.m.adapters.sql.rank"),
    ({"sql": {"path": "a.gguf", "aliases": ["a*"]}}, "$.models.m.adapters.sql.aliases[0]"),
])
def test_a_bad_declaration_names_its_path(adapters, path):
    assert [p["path"] for p in problems({"m": {**GGUF, "adapters": adapters}})] == [path]


def test_an_adapters_id_or_alias_may_not_be_another_models_name_or_alias():
    details = problems({
        "m": {**GGUF, "aliases": ["tuned"], "adapters": {"sql": {"path": "a.gguf", "aliases": ["tuned", "other"]}}},
        "m:sql": GGUF,
        "other": GGUF,
    })
    assert [(p["path"], p["message"]) for p in details] == [
        ("$.models.m.adapters.sql", "'m:sql' is the name of a model"),
        ("$.models.m.adapters.sql.aliases[0]", "'tuned' is an alias of m already"),
        ("$.models.m.adapters.sql.aliases[1]", "'other' is the name of a model"),
    ]


@pytest.mark.parametrize("definition", [
    {**GGUF, "rerank": True},
    {"backend": "llama_server", "model_path": "base.gguf", "rerank": True},
    {"backend": "vllm_serve", "model_path": "org/base", "embeddings": True},
    {"backend": "vllm_serve", "model_path": "org/base", "rerank": True},
])
def test_a_model_that_does_not_generate_declares_no_adapters(definition):
    details = problems({"m": {**definition, "adapters": {"sql": {"path": "sql"}}}})
    assert [p["path"] for p in details] == ["$.models.m"]
    assert "adapters serve generation" in details[0]["message"]


def test_a_llama_server_adapters_path_has_no_comma():
    details = problems({"m": {"backend": "llama_server", "model_path": "b.gguf", "adapters": {"a": {"path": "x,y.gguf"}}}})
    assert [p["path"] for p in details] == ["$.models.m"] and "comma" in details[0]["message"]


# ---- adapters_loaded: which declared adapters a loaded model holds -----------------------------

LOADING_BACKENDS = {
    "llama_cpp": GGUF,
    "vllm": {"backend": "vllm", "model_path": "org/base"},
    "vllm_serve": {"backend": "vllm_serve", "model_path": "org/base"},
}


def declaring(definition: dict, **fields):
    spec = BACKENDS[definition["backend"]]
    return spec, spec.definition_model.model_validate({**definition, "adapters": {"sql": {"path": "sql"}}, **fields})


@pytest.mark.parametrize("backend", list(LOADING_BACKENDS))
def test_adapters_loaded_is_a_reconfigurable_override_naming_declared_adapters(backend):
    spec, definition = declaring(LOADING_BACKENDS[backend])
    assert "adapters_loaded" in spec.reconfigurable_fields()
    for kept in (["sql"], [], None):
        assert spec.validate_overrides(definition, {"adapters_loaded": kept}) == {"adapters_loaded": kept}
    with pytest.raises(InvalidLoadRequest) as refused:
        spec.validate_overrides(definition, {"adapters_loaded": ["sql", "nope"]})
    assert (refused.value.code, refused.value.param) == ("invalid_load_request", "adapters_loaded")
    assert "nope" in refused.value.message


def test_llama_server_has_no_adapters_loaded():
    spec, definition = declaring({"backend": "llama_server", "model_path": "base.gguf"})
    with pytest.raises(InvalidLoadRequest, match="not a load override of backend llama_server") as refused:
        spec.validate_overrides(definition, {"adapters_loaded": ["sql"]})
    assert refused.value.param == "adapters_loaded"


@pytest.mark.parametrize("backend", list(LOADING_BACKENDS))
def test_a_definitions_own_adapters_loaded_names_declared_adapters(backend):
    model = {**LOADING_BACKENDS[backend], "adapters": {"sql": {"path": "sql"}}, "adapters_loaded": ["nope"]}
    details = problems({"m": model})
    assert [p["path"] for p in details] == ["$.models.m"]
    assert "adapters_loaded names adapters the model does not declare: nope" in details[0]["message"]


@pytest.mark.parametrize("runtime_lora, mode", [(False, {"reconfigure_mode": "restart"}), (True, {})])
def test_vllm_serve_reconfigures_adapters_loaded_by_a_restart_unless_runtime_lora_is_allowed(runtime_lora, mode):
    spec, definition = declaring(LOADING_BACKENDS["vllm_serve"], vllm_runtime_lora=runtime_lora)
    assert spec.load_constraints(definition)["adapters_loaded"] == {**ADAPTERS_LOADED.constraint, **mode}
