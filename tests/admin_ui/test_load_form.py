"""The Load form built from load_constraints, and the effective loaded values (spec merge rule)."""
from __future__ import annotations

import pytest
from django.http import QueryDict

from models_app.workbench.forms import MIB, LoadForm
from models_app.selectors import effective_values
from runtime.backends import BACKENDS
from runtime.errors import InvalidLoadRequest, LoadBodyInvalid, ModelStateConflict
from tests.spec_examples import GGML_CACHE_TYPES


def entry(constraints: dict, *, definition: dict | None = None, override: dict | None = None,
          recommendations: dict | None = None, replica_max: int = 4) -> dict:
    return {
        "name": "m",
        "replicas": 1,
        "replica_max": replica_max,
        "definition": {"backend": "x", "replicas": 1, **(definition or {})},
        "load_override": override or {},
        "load_constraints": constraints,
        "load_recommendations": recommendations or {},
    }


def spec_entry(backend: str, definition: dict) -> dict:
    """An entry whose constraints and recommendations come from the real backend spec."""
    spec = BACKENDS[backend]
    parsed = spec.definition_model.model_validate({"backend": backend, **definition}, strict=False)
    return entry(spec.load_constraints(parsed), definition=parsed.model_dump(),
                 recommendations=spec.load_recommendations(parsed), replica_max=parsed.replica_max)


def bound(form_entry: dict, data: dict) -> LoadForm:
    query = QueryDict(mutable=True)
    for key, value in data.items():
        query[key] = value
    form = LoadForm(form_entry, query)
    assert form.is_valid(), form.errors
    return form


# ---- rendering from constraints ------------------------------------------------------------


def test_llama_cpp_controls_follow_its_constraints():
    form = LoadForm(spec_entry("llama_cpp", {"model_path": "/m.gguf"}))
    html = {row.name: str(row.field) for row in form.rows}
    assert list(html) == ["replicas", "target_inflight", "gguf_n_ctx", "gguf_flash_attn", "gguf_type_k", "gguf_type_v",
                          "gguf_spec_type", "gguf_spec_draft_n_max", "gguf_spec_draft_p_min", "adapters_loaded"]
    assert "<select" in html["gguf_spec_type"] and 'value="ngram-simple"' in html["gguf_spec_type"]
    assert 'type="number"' in html["gguf_n_ctx"] and 'min="1"' in html["gguf_n_ctx"] and 'step="1"' in html["gguf_n_ctx"]
    assert 'max="1"' in html["replicas"]  # replica_max
    assert "<select" in html["gguf_flash_attn"]
    for value in ("on", "off", "auto"):
        assert f'value="{value}"' in html["gguf_flash_attn"]
    rows = {row.name: row for row in form.rows}
    assert 'list="gguf_type_k-values"' in html["gguf_type_k"]
    assert rows["gguf_type_k"].datalist == GGML_CACHE_TYPES
    assert rows["gguf_type_k"].null is not None and "f16" in rows["gguf_type_k"].null.label
    assert rows["gguf_n_ctx"].null is None


def test_presets_come_from_load_recommendations():
    form = LoadForm(spec_entry("llama_cpp", {"model_path": "/m.gguf"}))
    [(title, notes, presets)] = form.presets
    assert "gguf cache type pairs" in title
    assert [p.label for p in presets] == ["f16/f16", "q8_0/q8_0", "q4_0/q4_0"]
    assert presets[1].values == {"gguf_type_k": "q8_0", "gguf_type_v": "q8_0"}
    assert notes


def test_exllama_bit_presets_keep_null():
    form = LoadForm(spec_entry("exllamav3", {"model_path": "/m"}))
    presets = {p.label: p.values for _, _, group in form.presets for p in group}
    assert presets["fp16"] == {"exllama_cache_k_bits": None, "exllama_cache_v_bits": None}
    html = str(form["exllama_cache_k_bits"])
    assert '<option value="null">null (fp16)</option>' in html and '<option value="8">8</option>' in html


def test_byte_fields_are_shown_in_mib_and_sent_in_bytes():
    form = LoadForm(spec_entry("vllm_serve", {"model_path": "/m"}))
    html = str(form["vllm_kv_cache_memory_bytes"])
    assert 'min="256"' in html and 'step="256"' in html
    assert "in MiB" in form.fields["vllm_kv_cache_memory_bytes"].help_text
    body = bound(spec_entry("vllm_serve", {"model_path": "/m"}), {"vllm_kv_cache_memory_bytes": "2048"}).load_body()
    assert body == {"vllm_kv_cache_memory_bytes": 2048 * MIB}


def test_float_boolean_and_target_inflight_controls():
    trt = LoadForm(spec_entry("trtllm_serve", {"model_path": "/m"}))
    assert "target_inflight" in trt.fields
    assert '<option value="true">true</option>' in str(trt["trtllm_enable_chunked_prefill"])
    sgl = spec_entry("sglang_serve", {"model_path": "/m"})
    html = str(LoadForm(sgl)["sglang_mem_fraction_static"])
    assert 'min="0.01"' in html and 'max="1"' in html and 'step="0.01"' in html
    body = bound(sgl, {"sglang_mem_fraction_static": "0.35", "target_inflight": "4"}).load_body()
    assert body == {"sglang_mem_fraction_static": 0.35, "target_inflight": 4}
    assert "target_inflight" in LoadForm(spec_entry("llama_cpp", {"model_path": "/m"})).fields
    assert "target_inflight" not in LoadForm(spec_entry("exllamav3", {"model_path": "/m"})).fields


def test_stub_form_offers_replicas_only():
    form = LoadForm(entry({}, replica_max=3))
    assert [row.name for row in form.rows] == ["replicas"]
    assert form.presets == []


# ---- the body: key presence, null included ------------------------------------------------------


def test_empty_fields_are_left_out_and_null_boxes_send_null():
    llama = spec_entry("llama_cpp", {"model_path": "/m.gguf"})
    assert bound(llama, {}).load_body() == {}
    body = bound(llama, {"gguf_n_ctx": "8192", "gguf_flash_attn": "on", "gguf_type_k": "q8_0",
                         "gguf_type_v": "ignored", "gguf_type_v__null": "on", "replicas": "1"}).load_body()
    assert body == {"replicas": 1, "gguf_n_ctx": 8192, "gguf_flash_attn": "on", "gguf_type_k": "q8_0",
                    "gguf_type_v": None}


def test_choice_values_keep_their_types():
    exllama = spec_entry("exllamav3", {"model_path": "/m"})
    body = bound(exllama, {"exllama_cache_k_bits": "8", "exllama_cache_v_bits": "null"}).load_body()
    assert body == {"exllama_cache_k_bits": 8, "exllama_cache_v_bits": None}
    trt = spec_entry("trtllm_serve", {"model_path": "/m"})
    assert bound(trt, {"trtllm_enable_chunked_prefill": "false"}).load_body() == {"trtllm_enable_chunked_prefill": False}


def test_values_the_runtime_rejects_pass_through_to_it():
    """Range checks are the runtime's (422 / 400), not the form's: nothing is rejected twice."""
    llama = spec_entry("llama_cpp", {"model_path": "/m.gguf"})
    assert bound(llama, {"gguf_n_ctx": "0", "gguf_type_k": "q8-0"}).load_body() == {"gguf_n_ctx": 0, "gguf_type_k": "q8-0"}


# ---- the runtime's errors next to the fields -------------------------------------------------------


@pytest.mark.parametrize(
    "error, field",
    [
        (LoadBodyInvalid("$.gguf_n_ctx: too small", param="gguf_n_ctx",
                         details=[{"path": "$.gguf_n_ctx", "message": "Input should be greater than or equal to 1"}]),
         "gguf_n_ctx"),
        (InvalidLoadRequest("gguf_type_k='q8-0' is not allowed", param="gguf_type_k"), "gguf_type_k"),
        (InvalidLoadRequest("replicas=9 exceeds replica_max=1", param="replicas"), "replicas"),
        (ModelStateConflict("model m is unloading"), None),
    ],
    ids=["422-path", "400-param", "400-replicas", "409-form"],
)
def test_runtime_errors_land_next_to_their_field(error, field):
    form = bound(spec_entry("llama_cpp", {"model_path": "/m.gguf"}), {"gguf_n_ctx": "0", "gguf_type_k": "q8-0"})
    form.add_runtime_error(error)
    errors = form.errors.get(field or "__all__")
    assert errors and error.code in errors[0]
    assert set(form.errors) == {field or "__all__"}
    assert form["gguf_type_k"].value() == "q8-0"  # nothing typed is lost


# ---- effective loaded values ---------------------------------------------------------------------


def rows_by_key(model: dict) -> dict:
    return {row["key"]: row for row in effective_values(model)}


def test_override_key_presence_wins_even_with_null():
    model = entry({}, definition={"exllama_cache_quant": "8,8", "exllama_cache_size": 8192},
                  override={"exllama_cache_quant": None})
    rows = rows_by_key(model)
    assert rows["exllama_cache_quant"]["effective"] is None and rows["exllama_cache_quant"]["overridden"]
    assert rows["exllama_cache_quant"]["meaning"] == "fp16 cache"
    assert rows["exllama_cache_size"]["effective"] == 8192 and not rows["exllama_cache_size"]["overridden"]


def test_falsy_definition_values_are_not_replaced():
    model = entry({}, definition={"trtllm_enable_chunked_prefill": False, "gguf_n_gpu_layers": 0})
    rows = rows_by_key(model)
    assert rows["trtllm_enable_chunked_prefill"]["effective"] is False
    assert rows["gguf_n_gpu_layers"]["effective"] == 0


def test_null_cache_types_mean_the_constraint_default():
    llama = spec_entry("llama_cpp", {"model_path": "/m.gguf", "gguf_type_v": "q4_0"})
    llama["load_override"] = {"gguf_type_v": None, "gguf_n_ctx": 32768}
    rows = rows_by_key(llama)
    assert rows["gguf_type_k"]["effective"] is None and rows["gguf_type_k"]["meaning"] == "runtime default: f16"
    assert rows["gguf_type_v"]["configured"] == "q4_0" and rows["gguf_type_v"]["effective"] is None
    assert rows["gguf_n_ctx"]["effective"] == 32768


def test_exllama_quant_pairs_and_mib_are_explained():
    model = entry({"vllm_kv_cache_memory_bytes": {"kind": "integer", "unit": "bytes", "display_unit": "mib"}},
                  definition={"exllama_cache_quant": "8,4", "vllm_kv_cache_memory_bytes": 2 * 1024 * MIB},
                  override={"only_in_override": 1})
    rows = rows_by_key(model)
    assert rows["exllama_cache_quant"]["meaning"] == "k=8 bits, v=4 bits"
    assert rows["vllm_kv_cache_memory_bytes"]["meaning"] == "2048 MiB"
    assert rows["only_in_override"]["effective"] == 1 and not rows["only_in_override"]["configured_present"]


def test_replicas_show_the_current_load():
    model = entry({}, definition={"replicas": 1})
    model.update(replicas=3, runtime_state="loaded")
    assert rows_by_key(model)["replicas"]["effective"] == 3
    assert "loaded now: 3" in LoadForm(model).fields["replicas"].help_text



def test_adapters_loaded_is_typed_as_names_separated_by_commas():
    llama = spec_entry("llama_cpp", {"model_path": "/m.gguf", "adapters": {"sql": {"path": "s"}, "poet": {"path": "p"}}})
    assert bound(llama, {"adapters_loaded": " sql, poet ,"}).load_body() == {"adapters_loaded": ["sql", "poet"]}
    assert bound(llama, {"adapters_loaded__null": "on"}).load_body() == {"adapters_loaded": None}
    assert bound(llama, {"adapters_loaded": ""}).load_body() == {}
