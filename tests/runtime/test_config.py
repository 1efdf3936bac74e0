import json

import pytest

from runtime.config import deep_merge, load_settings, parse_load_body, validate_settings
from runtime.errors import InvalidSettings, LoadBodyInvalid


def test_deep_merge_objects_by_key_and_replaces_the_rest():
    base = {"a": {"x": 1, "y": [1, 2]}, "b": 1}
    overlay = {"a": {"y": [3], "z": 2}, "b": {"new": True}}
    assert deep_merge(base, overlay) == {"a": {"x": 1, "y": [3], "z": 2}, "b": {"new": True}}


def test_local_json_merges_over_settings_and_null_removes_a_model(tmp_path):
    (tmp_path / "settings.json").write_text(json.dumps({
        "service": {"port": 9000},
        "models": {
            "keep": {"backend": "stub", "stub_reply": "base", "replicas": 2, "replica_max": 3},
            "drop": {"backend": "stub"},
        },
    }))
    (tmp_path / "local.json").write_text(json.dumps({
        "models": {"keep": {"stub_reply": "local"}, "drop": None, "extra": {"backend": "stub"}},
    }))
    loaded = load_settings(str(tmp_path / "settings.json"))
    models = loaded.settings.models
    assert sorted(models) == ["extra", "keep"]
    assert models["keep"].stub_reply == "local"
    assert models["keep"].replicas == 2
    assert loaded.settings.service.port == 9000
    assert loaded.sources == {"keep": ["settings.json", "local.json"], "extra": ["local.json"]}


def test_every_problem_is_reported_with_its_json_path():
    with pytest.raises(InvalidSettings) as caught:
        validate_settings({
            "service": {"port": 0, "surprise": 1},
            "models": {
                "a": {"backend": "stub", "stub_token_delay_ms": "fast"},
                "b": {"backend": "warp-drive"},
                "c": {"stub_reply": "no backend"},
            },
        })
    paths = [problem["path"] for problem in caught.value.details]
    assert paths == [
        "$.service.port", "$.service.surprise", "$.models.a.stub_token_delay_ms", "$.models.b", "$.models.c",
    ]
    assert caught.value.code == "invalid_settings"


def test_replicas_may_not_exceed_replica_max():
    with pytest.raises(InvalidSettings, match="replica_max"):
        validate_settings({"models": {"a": {"backend": "stub", "replicas": 3, "replica_max": 2}}})


def test_replica_max_defaults_to_replicas_and_text_is_always_a_modality():
    model = validate_settings({"models": {"a": {"backend": "stub", "replicas": 2, "modalities": ["image"]}}}).models["a"]
    assert model.replica_max == 2
    assert model.modalities == ["text", "image"]


@pytest.mark.parametrize("name", ["bad name", "../x", "", "-lead"])
def test_model_names_are_url_safe(name):
    with pytest.raises(InvalidSettings):
        validate_settings({"models": {name: {"backend": "stub"}}})


def test_invalid_json_names_the_file_and_line(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text('{"models": {\n  "a": }')
    with pytest.raises(InvalidSettings, match=r"settings.json: invalid JSON at line 2"):
        load_settings(str(path))


def test_load_body_keeps_only_sent_keys_and_null():
    assert parse_load_body({"gguf_type_k": None, "gguf_n_ctx": 8192}) == {"gguf_type_k": None, "gguf_n_ctx": 8192}
    assert parse_load_body(None) == {}


@pytest.mark.parametrize("body", [{"gguf_n_ctx": "8192"}, {"replicas": 0}, {"mystery": 1}, {"trtllm_enable_chunked_prefill": "yes"}])
def test_load_body_schema_failures_are_422(body):
    with pytest.raises(LoadBodyInvalid) as caught:
        parse_load_body(body)
    assert caught.value.http_status == 422


KEY_HASH = "0" * 64


def api_key(**fields) -> dict:
    return {"name": "alice", "key_sha256": KEY_HASH, "models": "*", **fields}


def test_api_keys_and_fairness_headers_have_defaults_and_a_bucket():
    service = validate_settings({}).service
    assert (service.api_keys, service.fairness_key_headers) == ([], ["X-LLMPool-Fairness-Key"])
    keys = validate_settings({"service": {"api_keys": [
        api_key(models=["echo", "slow"]), api_key(name="bob", key_sha256="1" * 64, fairness_key="team-b", weight=2),
    ]}}).service.api_keys
    assert [(key.bucket, key.models, key.weight) for key in keys] == [
        ("alice", ["echo", "slow"], None), ("team-b", "*", 2.0),
    ]


@pytest.mark.parametrize(("service", "path"), [
    ({"api_keys": [api_key(key_sha256="A" * 64)]}, "$.service.api_keys[0].key_sha256"),
    ({"api_keys": [api_key(key_sha256="0" * 63)]}, "$.service.api_keys[0].key_sha256"),
    ({"api_keys": [api_key(models="all")]}, "$.service.api_keys[0].models"),
    ({"api_keys": [api_key(models=[])]}, "$.service.api_keys[0].models"),
    ({"api_keys": [api_key(models=["bad name"])]}, "$.service.api_keys[0].models"),
    ({"api_keys": [api_key(name="no spaces")]}, "$.service.api_keys[0].name"),
    ({"api_keys": [api_key(weight=0)]}, "$.service.api_keys[0].weight"),
    ({"api_keys": [api_key(fairness_key="")]}, "$.service.api_keys[0].fairness_key"),
    ({"api_keys": [api_key(scope="all")]}, "$.service.api_keys[0].scope"),
    ({"api_keys": [{"name": "alice", "models": "*"}]}, "$.service.api_keys[0].key_sha256"),
    ({"api_keys": [api_key(), api_key(key_sha256="1" * 64)]}, "$.service.api_keys[1].name"),
    ({"api_keys": [api_key(), api_key(name="bob")]}, "$.service.api_keys[1].key_sha256"),
    ({"api_keys": [api_key(fairness_key="t", weight=2), api_key(name="bob", key_sha256="1" * 64, fairness_key="t",
                                                                 weight=3)]}, "$.service.api_keys[1].weight"),
    ({"api_keys": [api_key(requests_per_minute=0)]}, "$.service.api_keys[0].requests_per_minute"),
    ({"api_keys": [api_key(tokens_per_minute="60")]}, "$.service.api_keys[0].tokens_per_minute"),
    ({"api_keys": [api_key(max_concurrent=1.5)]}, "$.service.api_keys[0].max_concurrent"),
    ({"api_keys": [api_key(token_budget=10**16, budget_period="day")]}, "$.service.api_keys[0].token_budget"),
    ({"api_keys": [api_key(token_budget=1000)]}, "$.service.api_keys[0]"),
    ({"api_keys": [api_key(budget_period="week", token_budget=1000)]}, "$.service.api_keys[0].budget_period"),
    ({"api_keys": [api_key(priority="urgent")]}, "$.service.api_keys[0].priority"),
    ({"api_keys": [api_key(queue_timeout_seconds=-1)]}, "$.service.api_keys[0].queue_timeout_seconds"),
    ({"api_keys": [api_key(queue_timeout_seconds=True)]}, "$.service.api_keys[0].queue_timeout_seconds"),
    ({"api_keys": [api_key(weight=1001)]}, "$.service.api_keys[0].weight"),
    ({"fairness_key_headers": ["Not A Header"]}, "$.service.fairness_key_headers[0]"),
    ({"fairness_key_headers": "X-User"}, "$.service.fairness_key_headers"),
])
def test_invalid_api_key_entries_name_their_path(service, path):
    with pytest.raises(InvalidSettings) as caught:
        validate_settings({"service": service})
    assert [problem["path"] for problem in caught.value.details] == [path]


def test_a_key_declares_the_limits_and_queue_terms_a_key_of_the_database_has():
    [key] = validate_settings({"service": {"api_keys": [api_key(
        requests_per_minute=60, tokens_per_minute=10_000, max_concurrent=2, token_budget=10**6, budget_period="month",
        priority="batch", queue_timeout_seconds=30)]}}).service.api_keys
    assert (key.requests_per_minute, key.tokens_per_minute, key.max_concurrent, key.token_budget, key.budget_period,
            key.priority, key.queue_timeout_seconds) == (60, 10_000, 2, 10**6, "month", "batch", 30)
    assert validate_settings({"service": {"api_keys": [api_key()]}}).service.api_keys[0].priority == "default"


def test_a_key_s_problems_carry_a_code_and_reach_the_envelope():
    """What a reload answers (400 invalid_settings): each problem of a key with its path and a code."""
    with pytest.raises(InvalidSettings) as caught:
        validate_settings({"service": {"port": 0, "api_keys": [
            api_key(requests_per_minute=0), api_key(name="bob", key_sha256="1" * 64, token_budget=5)]}})
    details = caught.value.envelope()["error"]["details"]
    assert [(problem["path"], problem.get("code")) for problem in details] == [
        ("$.service.port", None),
        ("$.service.api_keys[0].requests_per_minute", "api_key_invalid"),
        ("$.service.api_keys[1]", "api_key_invalid"),
    ]
    assert "budget_period" in details[2]["message"]


def test_a_bucket_weight_is_declared_once():
    with pytest.raises(InvalidSettings) as caught:
        validate_settings({
            "service": {"api_keys": [api_key(weight=2)]},
            "engine": {"fairness": {"weights": {"alice": 1}}},
        })
    assert [problem["path"] for problem in caught.value.details] == ["$.service.api_keys[0].weight"]
    same = [api_key(fairness_key="t", weight=2), api_key(name="bob", key_sha256="1" * 64, fairness_key="t", weight=2)]
    assert len(validate_settings({"service": {"api_keys": same}}).service.api_keys) == 2
