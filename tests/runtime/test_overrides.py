"""Each load override is declared once; the load-body schema, the 422/400 split and
load_constraints all come from that declaration."""
import pytest

from runtime.backends import BACKENDS
from runtime.backends.shared.overrides import TARGET_INFLIGHT, LoadOverride, load_body_model
from runtime.config import LoadBody, parse_load_body
from runtime.errors import InvalidLoadRequest, LoadBodyInvalid

WITH_OVERRIDES = [name for name, spec in BACKENDS.items() if spec.overrides]
# Only a load body carries these (the engine turns them into its cache quantization).
LOAD_ONLY = {"exllama_cache_k_bits", "exllama_cache_v_bits"}


@pytest.mark.parametrize("backend", WITH_OVERRIDES)
def test_every_override_is_a_field_of_its_definition(backend):
    spec = BACKENDS[backend]
    assert set(spec.override_fields) - LOAD_ONLY <= set(spec.definition_model.model_fields)


def test_the_load_body_schema_is_replicas_plus_every_declared_override():
    declared = {override.name for spec in BACKENDS.values() for override in spec.accepted_overrides().values()}
    assert set(LoadBody.model_fields) == {"replicas"} | declared


# vllm_serve marks adapters_loaded "reconfigure_mode": "restart" unless its definition allows
# vLLM's runtime LoRA loading; with it, its constraints are the declarations as they are.
RUNTIME_LORA = BACKENDS["vllm_serve"].definition_model.model_validate(
    {"backend": "vllm_serve", "vllm_serve_model": "org/m", "vllm_runtime_lora": True})


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_load_constraints_are_the_declarations_in_order(backend):
    spec = BACKENDS[backend]
    accepted = ([TARGET_INFLIGHT] if spec.concurrent else []) + list(spec.overrides)
    constraints = spec.load_constraints(RUNTIME_LORA if backend == "vllm_serve" else None)
    assert list(constraints.items()) == [(o.name, o.constraint) for o in accepted]


def test_the_body_type_is_the_422_and_the_constraint_the_400():
    spec = BACKENDS["vllm"]
    with pytest.raises(LoadBodyInvalid) as schema_miss:
        parse_load_body({"vllm_max_model_len": 0})  # fails the body type (a positive integer)
    assert schema_miss.value.param == "vllm_max_model_len"
    body = parse_load_body({"vllm_max_model_len": 300})  # passes the body type ...
    with pytest.raises(InvalidLoadRequest, match="multiple of 256"):  # ... not the constraint
        spec.validate_overrides(None, body)
    assert spec.validate_overrides(None, parse_load_body({"vllm_max_model_len": 512})) == {"vllm_max_model_len": 512}


def test_a_value_accepted_beyond_allowed_values_is_not_listed():
    spec = BACKENDS["vllm"]
    assert "fp8_per_token_head" not in spec.load_constraints(None)["vllm_kv_cache_dtype"]["allowed_values"]
    assert spec.validate_overrides(None, {"vllm_kv_cache_dtype": "fp8_per_token_head"})


def test_a_field_two_backends_share_must_be_declared_alike():
    one, other = LoadOverride("x", int, {"kind": "integer"}), LoadOverride("x", str, {"kind": "enum"})
    assert list(load_body_model([one, LoadOverride("x", int, {"kind": "integer"})]).model_fields) == ["replicas", "x"]
    with pytest.raises(TypeError, match="declared twice"):
        load_body_model([one, other])
