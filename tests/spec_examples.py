"""The API contract's example data, transcribed once from /work/shared/spec/runtime-admin-api.md.

Every value here is copied from the spec (JSON ``null``/``false`` written as
``None``/``False``), so a test that compares against it compares against the
contract.  Sections of the spec they come from:

* "Current load_constraints Shapes": the per-backend ``load_constraints`` and
  the GGUF / ExLlamaV3 recommended presets.  The notes of the GGUF presets come
  from the AdminModelEntry example under "GET /v1/admin/models".
* "POST /v1/admin/models/{model_name}/load", "Example load bodies".
* The same endpoint's "Validation behavior" examples (422 and 400).

The objects are shared by many test modules: treat them as read-only and copy
before changing one.
"""
from __future__ import annotations

# ---- load_constraints ("Current load_constraints Shapes") ---------------------------------

# Backends that support a load-time inflight target include this constraint.
TARGET_INFLIGHT_CONSTRAINT = {"target_inflight": {"kind": "integer", "minimum": 1, "step": 1}}

# llama_cpp GGUF.
GGML_CACHE_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
_GGUF_CACHE_TYPE = {
    "kind": "string_or_null",
    "format": "ggml_type_name",
    "default": "f16",
    "allowed_values": GGML_CACHE_TYPES,
    "examples": ["f16", "q8_0", "q4_0"],
}
LLAMA_CPP_CONSTRAINTS = {
    "gguf_n_ctx": {"kind": "integer", "minimum": 1, "step": 1},
    "gguf_flash_attn": {
        "kind": "enum",
        "default": "auto",
        "allowed_values": ["on", "off", "auto"],
        "examples": ["auto", "on", "off"],
    },
    "gguf_type_k": _GGUF_CACHE_TYPE,
    "gguf_type_v": _GGUF_CACHE_TYPE,
    "gguf_spec_type": {
        "kind": "enum",
        "default": None,
        "allowed_values": ["ngram-simple", "draft-simple"],
        "examples": ["ngram-simple", "draft-simple"],
    },
    "gguf_spec_draft_n_max": {"kind": "integer", "minimum": 1, "maximum": 64, "step": 1, "default": 8},
    "gguf_spec_draft_p_min": {"kind": "float", "minimum": 0.0, "maximum": 1.0, "default": 0.0},
}

# ExLlamaV3.
_EXLLAMA_BITS = {
    "kind": "integer_or_null",
    "minimum": 2,
    "maximum": 8,
    "default": None,
    "null_means": "fp16",
    "allowed_values": [2, 3, 4, 5, 6, 7, 8],
}
EXLLAMA_CONSTRAINTS = {
    "exllama_cache_size": {"kind": "integer", "minimum": 256, "step": 256},
    "exllama_max_rq_tokens": {"kind": "integer", "minimum": 1, "step": 1},
    "exllama_cache_k_bits": _EXLLAMA_BITS,
    "exllama_cache_v_bits": _EXLLAMA_BITS,
    "exllama_cache_quant": {"kind": "string_or_null", "format": "<bits>|<k_bits>,<v_bits>"},
}

# vLLM and vLLM Serve.
VLLM_CONSTRAINTS = {
    "vllm_max_model_len": {"kind": "integer", "minimum": 256, "step": 256},
    "vllm_kv_cache_dtype": {
        "kind": "enum",
        "default": "auto",
        "allowed_values": ["auto", "fp8", "fp8_e4m3", "fp8_e5m2"],
        "examples": ["auto", "fp8"],
    },
    "vllm_kv_cache_memory_bytes": {
        "kind": "integer",
        "minimum": 268435456,
        "step": 268435456,
        "unit": "bytes",
        "display_unit": "mib",
    },
    "vllm_max_pixels": {"kind": "integer", "minimum": 200704, "step": 200704, "unit": "pixels"},
    "vllm_speculative_method": {
        "kind": "string_or_null",
        "format": "vllm_speculative_method",
        "default": None,
        "examples": ["mtp", "draft_model", "mlp_speculator"],
    },
    "vllm_speculative_model": {
        "kind": "string_or_null",
        "format": "hf_id_or_local_path",
        "default": None,
        "examples": ["google/gemma-4-26B-A4B-it-assistant"],
    },
    "vllm_speculative_moe_backend": {
        "kind": "string_or_null",
        "format": "vllm_moe_backend",
        "default": None,
        "examples": ["triton", "marlin"],
    },
    "vllm_speculative_attention_backend": {
        "kind": "string_or_null",
        "format": "vllm_attention_backend",
        "default": None,
        "examples": ["triton_attn", "flashinfer"],
    },
    "vllm_num_speculative_tokens": {"kind": "integer", "minimum": 1, "step": 1, "default": 1},
}

# TensorRT-LLM Serve.
TRTLLM_CONSTRAINTS = {
    "trtllm_max_seq_len": {"kind": "integer", "minimum": 256, "step": 256},
    "trtllm_kv_cache_memory_bytes": {
        "kind": "integer",
        "minimum": 268435456,
        "step": 268435456,
        "unit": "bytes",
        "display_unit": "mib",
    },
    "trtllm_max_num_tokens": {"kind": "integer", "minimum": 256, "step": 256},
    "trtllm_enable_chunked_prefill": {"kind": "boolean", "default": False},
    "trtllm_kv_cache_dtype": {
        "kind": "enum",
        "default": "auto",
        "allowed_values": ["auto", "fp8", "nvfp4"],
        "examples": ["auto", "fp8", "nvfp4"],
    },
}

# SGLang Serve.
SGLANG_CONSTRAINTS = {
    "sglang_context_length": {"kind": "integer", "minimum": 256, "step": 256},
    "sglang_mem_fraction_static": {"kind": "float", "minimum": 0.01, "maximum": 1.0, "step": 0.01},
    "sglang_max_total_tokens": {"kind": "integer", "minimum": 256, "step": 256, "unit": "tokens"},
    "sglang_chunked_prefill_size": {"kind": "integer", "minimum": -1, "step": 1},
    "sglang_kv_cache_dtype": {
        "kind": "enum",
        "default": "auto",
        "allowed_values": [
            "auto",
            "bf16",
            "bfloat16",
            "fp8_e4m3",
            "fp8_e5m2",
            "mxfp8",
            "nvfp4",
            "fp4_mx_block16",
            "fp4_e2m1",
        ],
    },
    "sglang_speculative_algorithm": {
        "kind": "string_or_null",
        "format": "sglang_speculative_algorithm",
        "default": None,
        "examples": ["NEXTN"],
    },
    "sglang_speculative_draft_model": {
        "kind": "string_or_null",
        "format": "hf_id_or_local_path",
        "default": None,
        "examples": ["google/gemma-4-26B-A4B-it-assistant"],
    },
    "sglang_speculative_num_steps": {"kind": "integer", "minimum": 1, "step": 1, "default": 5},
    "sglang_speculative_num_draft_tokens": {"kind": "integer", "minimum": 1, "step": 1, "default": 6},
    "sglang_speculative_eagle_topk": {"kind": "integer", "minimum": 1, "step": 1, "default": 1},
}

# llama-server.
LLAMA_SERVER_CONSTRAINTS = {
    "llama_server_n_ctx": {"kind": "integer", "minimum": 1, "step": 1},
    "llama_server_image_max_tokens": {"kind": "integer", "minimum": 1, "step": 1},
    "llama_server_spec_type": {
        "kind": "enum",
        "default": "draft-mtp",
        # The contract's ["draft-mtp"], extended (additively) to every mode llama-server has.
        "allowed_values": [
            "draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark", "draft-mtp",
            "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
        ],
        "examples": ["draft-mtp"],
    },
    "llama_server_spec_draft_n_max": {"kind": "integer", "minimum": 1, "maximum": 6, "step": 1, "default": 2},
    "llama_server_spec_ngram_n_max": {"kind": "integer", "minimum": 1, "maximum": 1024, "step": 1},
    "llama_server_spec_draft_n_min": {"kind": "integer", "minimum": 0, "maximum": 1024, "step": 1, "default": 0},
    "llama_server_spec_draft_p_min": {"kind": "float", "minimum": 0.0, "maximum": 1.0, "default": 0.0},
    "llama_server_spec_ngram_size_n": {"kind": "integer", "minimum": 1, "maximum": 1024, "step": 1, "default": 12},
    "llama_server_spec_ngram_min_hits": {"kind": "integer", "minimum": 1, "step": 1, "default": 1},
}

# The whole load_constraints of each backend: its own constraints ("CT2, openai_remote, and
# stub: {}"), after target_inflight's for the backends the spec gives a load-time inflight target
# (llama_server, openai_remote, vllm_serve, trtllm_serve and sglang_serve).
LOAD_CONSTRAINTS = {
    "llama_cpp": LLAMA_CPP_CONSTRAINTS,
    "exllamav3": EXLLAMA_CONSTRAINTS,
    "vllm": VLLM_CONSTRAINTS,
    "vllm_serve": {**TARGET_INFLIGHT_CONSTRAINT, **VLLM_CONSTRAINTS},
    "trtllm_serve": {**TARGET_INFLIGHT_CONSTRAINT, **TRTLLM_CONSTRAINTS},
    "sglang_serve": {**TARGET_INFLIGHT_CONSTRAINT, **SGLANG_CONSTRAINTS},
    "llama_server": {**TARGET_INFLIGHT_CONSTRAINT, **LLAMA_SERVER_CONSTRAINTS},
    "ct2": {},
    "openai_remote": TARGET_INFLIGHT_CONSTRAINT,
    "stub": {},
}

# Not the spec's: llm-pool's additive load_constraints (docs/api.md), which ``contract_view``
# takes away so what is left compares with the contract: the reconfigure keys of an entry, and
# the overrides llm-pool adds to a backend (llama_server's restart-mode reconfigurable flags, the
# LoRA adapters a model keeps loaded).
ADDITIVE_CONSTRAINT_KEYS = ("reconfigurable", "reconfigure_mode")
ADDITIVE_OVERRIDES = {
    "llama_server": ("llama_server_type_k", "llama_server_type_v", "llama_server_flash_attn"),
    # its replicas batch several sequences (runtime.backends.llama_cpp.batching); its LoRA adapters loaded
    "llama_cpp": ("target_inflight", "adapters_loaded"),
    "vllm": ("adapters_loaded",),  # its LoRA adapters loaded, as llama_cpp's
    "vllm_serve": ("adapters_loaded",),
}


def contract_view(backend: str, constraints: dict) -> dict:
    """``constraints`` without llm-pool's additive keys and overrides (key order kept)."""
    return {
        key: {field: value for field, value in entry.items() if field not in ADDITIVE_CONSTRAINT_KEYS}
        for key, entry in constraints.items() if key not in ADDITIVE_OVERRIDES.get(backend, ())
    }

# ---- load_recommendations -----------------------------------------------------------------

# "GGUF recommended presets".
GGUF_RECOMMENDATIONS = {
    "gguf_cache_type_pairs": {
        "kind": "pair_presets",
        "fields": ["gguf_type_k", "gguf_type_v"],
        "recommended_pairs": [
            {"label": "f16/f16", "gguf_type_k": "f16", "gguf_type_v": "f16"},
            {"label": "q8_0/q8_0", "gguf_type_k": "q8_0", "gguf_type_v": "q8_0"},
            {"label": "q4_0/q4_0", "gguf_type_k": "q4_0", "gguf_type_v": "q4_0"},
        ],
    }
}
# The "notes" the AdminModelEntry example adds to those presets.
GGUF_RECOMMENDATION_NOTES = [
    "Service-curated presets for GGUF cache types.",
    "Prefer symmetric GGUF K/V pairs by default; asymmetric pairs may reduce or disable GPU offload in "
    "upstream llama.cpp.",
]

# "ExLlamaV3 recommended presets".
EXLLAMA_RECOMMENDATIONS = {
    "exllama_cache_bit_pairs": {
        "kind": "pair_presets",
        "fields": ["exllama_cache_k_bits", "exllama_cache_v_bits"],
        "recommended_pairs": [
            {"label": "fp16", "exllama_cache_k_bits": None, "exllama_cache_v_bits": None},
            {"label": "8/8", "exllama_cache_k_bits": 8, "exllama_cache_v_bits": 8},
            {"label": "8/4", "exllama_cache_k_bits": 8, "exllama_cache_v_bits": 4},
        ],
    }
}

# ---- "Example load bodies", in the spec's order --------------------------------------------

REPLICAS_BODY = {"replicas": 3, "target_inflight": 4}
GGUF_BODIES = [
    {"gguf_n_ctx": 8192},
    {"gguf_n_ctx": 16384},
    {"gguf_n_ctx": 32768},
    {"gguf_n_ctx": 32768, "gguf_flash_attn": "auto", "gguf_type_k": "q8_0", "gguf_type_v": "q4_0"},
]
EXLLAMA_BODIES = [
    {"exllama_cache_size": 32768, "exllama_cache_quant": None, "exllama_max_rq_tokens": 32768},
    {"exllama_cache_size": 32768, "exllama_cache_quant": "8,8", "exllama_max_rq_tokens": 32768},
    {"exllama_cache_size": 32768, "exllama_cache_quant": "8,4", "exllama_max_rq_tokens": 32768},
    {
        "exllama_cache_size": 32768,
        "exllama_cache_k_bits": 8,
        "exllama_cache_v_bits": 4,
        "exllama_max_rq_tokens": 32768,
    },
]
VLLM_BODY = {
    "vllm_max_model_len": 16384,
    "vllm_kv_cache_dtype": "fp8",
    "vllm_kv_cache_memory_bytes": 2147483648,
    "vllm_max_pixels": 4014080,
    "vllm_speculative_method": "mtp",
    "vllm_speculative_model": "google/gemma-4-26B-A4B-it-assistant",
    "vllm_speculative_moe_backend": "triton",
    "vllm_speculative_attention_backend": "triton_attn",
    "vllm_num_speculative_tokens": 1,
}
TRTLLM_BODY = {
    "target_inflight": 4,
    "trtllm_max_seq_len": 20480,
    "trtllm_kv_cache_memory_bytes": 8589934592,
    "trtllm_max_num_tokens": 8192,
    "trtllm_enable_chunked_prefill": False,
    "trtllm_kv_cache_dtype": "fp8",
}
SGLANG_BODY = {
    "target_inflight": 4,
    "sglang_context_length": 20480,
    "sglang_mem_fraction_static": 0.35,
    "sglang_max_total_tokens": 20480,
    "sglang_chunked_prefill_size": 8192,
    "sglang_kv_cache_dtype": "fp8_e4m3",
    "sglang_speculative_algorithm": "NEXTN",
    "sglang_speculative_draft_model": "google/gemma-4-26B-A4B-it-assistant",
    "sglang_speculative_num_steps": 5,
    "sglang_speculative_num_draft_tokens": 6,
    "sglang_speculative_eagle_topk": 1,
}
LLAMA_SERVER_BODY = {
    "llama_server_n_ctx": 4096,
    "llama_server_image_max_tokens": 512,
    "llama_server_spec_type": "draft-mtp",
    "llama_server_spec_draft_n_max": 4,
    "llama_server_spec_draft_p_min": 0.25,
}

# ---- "Validation behavior" examples -------------------------------------------------------
# Each names the backend it is sent to.  The spec names none for target_inflight: 0, so that
# example goes to a backend that accepts target_inflight (llama_server).

# 422 invalid_load_body: (backend, field, value); the error's param is the field.
INVALID_LOAD_BODY_EXAMPLES = [
    ("llama_server", "target_inflight", 0),
    ("llama_cpp", "gguf_n_ctx", 0),
    ("exllamav3", "exllama_cache_size", 0),
    ("exllamav3", "exllama_max_rq_tokens", 0),
    ("trtllm_serve", "trtllm_kv_cache_memory_bytes", 0),
]

# 400 invalid_load_request: (label, backend, body, param), param being the field the error names.
# "sending load overrides while the model is already loaded" depends on the model's state, not on
# a body, so it is not in this list.
INVALID_LOAD_REQUEST_EXAMPLES = [
    ("gguf_type_k q8-0", "llama_cpp", {"gguf_type_k": "q8-0"}, "gguf_type_k"),
    ("gguf_type_k foo", "llama_cpp", {"gguf_type_k": "foo"}, "gguf_type_k"),
    ("k_bits without v_bits", "exllamav3", {"exllama_cache_k_bits": 8}, "exllama_cache_v_bits"),
    (
        "quant with k/v bits",
        "exllamav3",
        {"exllama_cache_quant": "8,8", "exllama_cache_k_bits": 8, "exllama_cache_v_bits": 8},
        "exllama_cache_quant",
    ),
    ("exllama_cache_size 8000", "exllamav3", {"exllama_cache_size": 8000}, "exllama_cache_size"),
    ("exllama_cache_quant fp16", "exllamav3", {"exllama_cache_quant": "fp16"}, "exllama_cache_quant"),
    (
        "llama_server_spec_type medusa",
        "llama_server",
        {"llama_server_spec_type": "medusa"},
        "llama_server_spec_type",
    ),
    (
        "llama_server_spec_draft_n_max 7",
        "llama_server",
        {"llama_server_spec_draft_n_max": 7},
        "llama_server_spec_draft_n_max",
    ),
    (
        "llama_server_spec_draft_p_min 1.5",
        "llama_server",
        {"llama_server_spec_draft_p_min": 1.5},
        "llama_server_spec_draft_p_min",
    ),
    ("trtllm_kv_cache_dtype int8", "trtllm_serve", {"trtllm_kv_cache_dtype": "int8"}, "trtllm_kv_cache_dtype"),
    ("exllama fields to llama_cpp", "llama_cpp", {"exllama_cache_size": 32768}, "exllama_cache_size"),
    ("llama-server fields to vllm", "vllm", {"llama_server_n_ctx": 4096}, "llama_server_n_ctx"),
]
