"""llama_cpp: GGUF models run through llama-cpp-python, by default in an engine process per replica.

This module holds the definition schema, the live-load rules and the VRAM
estimate; the engine is ``runtime.backends.llama_cpp.engine``, over the native
objects of ``runtime.backends.llama_cpp.native`` (llama-cpp-python is imported only
when a model loads, so processes that never load one never map libllama).
"""
from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, model_validator

from runtime.backends.base import (
    SAMPLING_OPTIONS,
    THINK_TAGS,
    THINKING_ALL,
    BackendSpec,
    CommonDefinition,
)
from runtime.backends.llama_cpp.engine import LlamaCppEngine
from runtime.backends.llama_cpp.native import native
from runtime.backends.llama_cpp.speculative import SPEC_TYPES, speculation_problem
from runtime.backends.shared.adapters import (
    ADAPTERS_LOADED,
    AdapterName,
    Adapters,
    adapters_field,
    check_loaded_names,
    refuse_adapters_without_generation,
    refuse_undeclared_loaded,
)
from runtime.backends.shared.common_fields import refuse_embeddings_with_rerank
from runtime.backends.shared.overrides import LoadOverride, PositiveInt, fields_fit, integer_override, refuse_problem
from runtime.pool.gguf_info import GgufError, GgufInfo, read_gguf_info
from runtime.pool.model_files import locate_model_file

GGML_CACHE_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
GgmlCacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
PROMPT_FORMATS = (
    "generic",
    "mistral_template",
    "qwen3_template",
    "gemma4_template",
    "translategemma_template",
    "gguf_template",
)
MULTI_TURN_FORMATS = {"generic", "mistral_template", "qwen3_template", "gemma4_template", "gguf_template"}


class LlamaCppDefinition(CommonDefinition):
    backend: Literal["llama_cpp"]
    isolation: Literal["process", "none"] = "process"  # a native fault kills the engine process only
    gguf_n_gpu_layers: int = Field(-1, ge=-1)
    gguf_n_ctx: int = Field(4096, ge=1)
    # The floor memory pressure may shrink the context to (runtime.model.residency) before evicting the model.
    gguf_n_ctx_min: int | None = Field(None, ge=1)
    gguf_n_batch: int = Field(512, ge=1)
    gguf_n_threads: int | None = Field(None, ge=1)
    gguf_flash_attn: Literal["on", "off", "auto"] = "auto"
    gguf_type_k: GgmlCacheType | None = None
    gguf_type_v: GgmlCacheType | None = None
    # POST /v1/embeddings too (runtime.inference.embedding): the context is built in llama.cpp's embedding
    # mode, pooled as the GGUF declares (mean when it declares none); the model still generates.
    embeddings: bool = False
    # POST /v1/rerank (runtime.inference.rerank): a reranker GGUF (pooling_type rank, a classification
    # head), its context built with llama.cpp's rank pooling; each pair is laid out as llama-server does.
    rerank: bool = False
    # The format the model writes tool calls in (runtime.inference.tool_calls): "auto" reads it from the
    # chat template (prompt_formats.tool_call_format: the template's own, else hermes, as the
    # tools are then described in the hermes format); "none": no tool calling (capabilities.tools false).
    tool_call_format: Literal["auto", "hermes", "llama3_json", "mistral", "none"] = "auto"
    # Speculative decoding (runtime.backends.llama_cpp.speculative): "ngram-simple" drafts by prompt
    # lookup, "draft-simple" with gguf_spec_draft_model (a GGUF on the same vocabulary); null: off.
    gguf_spec_type: Literal[SPEC_TYPES] | None = None
    gguf_spec_draft_model: str | None = None
    gguf_spec_draft_n_max: int = Field(8, ge=1, le=64)  # the longest draft a step verifies
    gguf_spec_draft_p_min: float = Field(0.0, ge=0, le=1)  # the draft model's confidence to go on drafting
    gguf_spec_ngram_size_n: int = Field(3, ge=1, le=16)  # the longest n-gram prompt lookup matches
    # LoRA adapters (GGUF), each a model id <model>:<adapter>, loaded with the base and applied per
    # batch (runtime.backends.shared.adapters, runtime.backends.llama_cpp.adapters).
    adapters: Adapters = adapters_field()
    # Which of them are loaded (null: all); a load override POST .../reconfigure changes live.
    adapters_loaded: list[AdapterName] | None = None

    @model_validator(mode="after")
    def _context_floor(self):
        if self.gguf_n_ctx_min is not None and self.gguf_n_ctx_min > self.gguf_n_ctx:
            raise ValueError(f"gguf_n_ctx_min ({self.gguf_n_ctx_min}) must not exceed gguf_n_ctx ({self.gguf_n_ctx})")
        return self

    @model_validator(mode="after")
    def _one_pooling(self):
        refuse_embeddings_with_rerank(self)
        refuse_adapters_without_generation(self, self.rerank)
        refuse_undeclared_loaded(self)
        return self

    _draft_model_named = model_validator(mode="after")(fields_fit(speculation_problem))

    @model_validator(mode="after")
    def _known_prompt_format(self):
        if self.prompt_format is not None and self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"prompt_format must be one of {', '.join(PROMPT_FORMATS)}")
        return self


def cache_type_constraint(**reconfigure) -> dict:
    """The load_constraints entry of a KV cache type override (llama_cpp's, llama_server's), with
    its reconfigure keys, llm-pool's own beyond the contract (default ``"reconfigurable": true``)."""
    return {
        "kind": "string_or_null",
        "format": "ggml_type_name",
        "default": "f16",
        "allowed_values": list(GGML_CACHE_TYPES),
        "examples": ["f16", "q8_0", "q4_0"],
        **(reconfigure or {"reconfigurable": True}),
    }


# The memory estimate's constants (estimate_parts), measured by bench/memory.py with llama.cpp
# on cpu (docs/performance.md): an engine process's own RSS besides its model (the interpreter,
# runtime.backends, libllama and its threads), what llama.cpp keeps per vocabulary token and BPE
# merge (its token tables and the GGUF metadata), and a margin for the compute buffers over
# the weights and KV cache (on cpu those are allocated but mostly not resident after a load).
ENGINE_PROCESS_BASELINE_MIB = 64
LLAMA_VOCAB_ENTRY_BYTES = 256
COMPUTE_MARGIN = 0.05
# What a process that puts llama.cpp layers on a GPU holds there besides its weights, KV cache
# and compute buffers: the CUDA context, cuBLAS's handles and workspace, and llama.cpp's CUDA
# memory pools.  Measured on one NVIDIA H200 with CUDA 13.0 (the llama.cpp of llama-cpp-python
# 0.3.36, docs/gpu.md "Results: one H200"): NVML's figure for the llama-server process of
# SmolLM2 135M at -c 4096 (788 MiB) less its weights, KV cache and the CUDA compute buffer
# llama.cpp reported (94 + 90 + 97 MiB) is 507 MiB.  Not a fraction: it does not grow with the model.
GPU_PROCESS_OVERHEAD_MIB = 512


def _mib(size: float) -> int:
    return int(-(-size // (1024 * 1024)))


def layers_on_gpu(n_gpu_layers: int | str | None, device: str | list[str] | None) -> bool:
    """Whether a llama.cpp load puts layers on a GPU: any layer count but 0 (-1, "auto", "all",
    null for llama-server's own default), unless the load is placed on ``cpu``."""
    return n_gpu_layers != 0 and device != "cpu"


def gguf_estimate_parts(
    path: str, info: GgufInfo | None, n_ctx: int, type_k: str | None, type_v: str | None, *, on_gpu: bool
) -> dict:
    """One llama.cpp process's memory estimate in parts for the model file at ``path``: the
    GGUF's tensors (the file), its KV cache for ``n_ctx`` tokens of the cache types, a compute
    margin, and its overhead: ``GPU_PROCESS_OVERHEAD_MIB`` with layers on a GPU, else the
    vocabulary it keeps in RAM (``LLAMA_VOCAB_ENTRY_BYTES`` per token and merge).  ``info``:
    the file's GGUF header; None for a file that is not GGUF, counted by its size alone."""
    if info is None:
        weights, cache, vocab = os.path.getsize(path), 0, 0
    else:
        weights = info.file_size
        cache = info.kv_cache_bytes(n_ctx, type_k, type_v) or 0
        vocab = sum(
            getattr(info.metadata.get(key), "length", 0) for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")
        )
    return {
        "weights_mib": _mib(weights),
        "kv_cache_mib": _mib(cache),
        "compute_mib": _mib((weights + cache) * COMPUTE_MARGIN),
        "overhead_mib": GPU_PROCESS_OVERHEAD_MIB if on_gpu else _mib(vocab * LLAMA_VOCAB_ENTRY_BYTES),
    }


def gguf_file(model_path: str | None, base_dir: str) -> tuple[str, GgufInfo] | None:
    """The file ``model_path`` names and its GGUF header; None for a missing file or one that is not GGUF."""
    path = locate_model_file(model_path, base_dir)
    if path is None or not os.path.isfile(path):
        return None
    try:
        return path, read_gguf_info(path)
    except (OSError, GgufError):
        return None


def kv_cells(config: dict) -> int:
    """The KV cache cells of one replica: n_ctx for each of its ``target_inflight`` sequences
    (the context's cache is not unified: every sequence has a stream of its own)."""
    return config["gguf_n_ctx"] * max(1, config.get("target_inflight") or 1)


class LlamaCppSpec(BackendSpec):
    name = "llama_cpp"
    definition_model = LlamaCppDefinition
    sleepable = True  # POST .../sleep frees the context and KV cache; the weights stay (runtime.model.residency)
    # target_inflight sequences share one context, decoded in one batch (runtime.backends.llama_cpp.batching).
    concurrent = True
    make_before_break = True  # a reconfigure builds the new context first where memory holds both
    overrides = (
        # "reconfigurable": POST .../reconfigure changes it while loaded (runtime.model.residency).
        integer_override("gguf_n_ctx", reconfigurable=True),
        LoadOverride(
            "gguf_flash_attn",
            str,
            {
                "kind": "enum",
                "default": "auto",
                "allowed_values": ["on", "off", "auto"],
                "examples": ["auto", "on", "off"],
                "reconfigurable": True,
            },
        ),
        LoadOverride("gguf_type_k", str, cache_type_constraint()),
        LoadOverride("gguf_type_v", str, cache_type_constraint()),
        LoadOverride("gguf_spec_type", str, {"kind": "enum", "default": None, "allowed_values": list(SPEC_TYPES),
                                             "examples": ["ngram-simple", "draft-simple"]}),
        LoadOverride("gguf_spec_draft_n_max", PositiveInt,
                     {"kind": "integer", "minimum": 1, "maximum": 64, "step": 1, "default": 8}),
        LoadOverride("gguf_spec_draft_p_min", float, {"kind": "float", "minimum": 0.0, "maximum": 1.0, "default": 0.0}),
        ADAPTERS_LOADED,  # adapters dropped or added back while loaded, the weights kept
    )

    def check_override_combination(self, definition, overrides):
        """``draft-simple`` needs the definition's draft model (``speculation_problem``); the
        adapters loaded must be the definition's."""
        refuse_problem(speculation_problem(self.effective_config(definition, overrides)))
        check_loaded_names(definition, overrides.get("adapters_loaded"))

    def context_length(self, config):
        return config.get("gguf_n_ctx")

    def prefix_cache_sequences(self, target_inflight):
        """One sequence per slot: a replica keeps the conversation each of its slots served last."""
        return target_inflight

    def sleeping_mib(self, definition, config, base_dir, awake_mib):
        """Asleep, the weights stay mapped (and the process): the estimate's weights and overhead."""
        parts = self.estimate_parts(definition, config, base_dir)
        return awake_mib if parts is None else parts["weights_mib"] + parts["overhead_mib"]

    def load_recommendations(self, definition):
        return {
            "gguf_cache_type_pairs": {
                "kind": "pair_presets",
                "fields": ["gguf_type_k", "gguf_type_v"],
                "recommended_pairs": [
                    {"label": f"{t}/{t}", "gguf_type_k": t, "gguf_type_v": t} for t in ("f16", "q8_0", "q4_0")
                ],
                "notes": [
                    "Service-curated presets for GGUF cache types.",
                    "Prefer symmetric GGUF K/V pairs by default; asymmetric pairs may reduce or disable GPU "
                    "offload in upstream llama.cpp.",
                ],
            }
        }

    def multi_turn(self, definition):
        """Not for a reranker (``rerank: true``), which answers POST /v1/rerank only."""
        return not definition.rerank and (definition.prompt_format or "gguf_template") in MULTI_TURN_FORMATS

    def tools(self, definition) -> bool:
        """Tools are rendered through the chat template (or described as hermes text) and the
        calls read out of the answer; tool_choice "required" or a named function constrains
        the answer with a grammar from the tools' JSON schemas.  Not for a single-turn format."""
        return definition.tool_call_format != "none" and self.multi_turn(definition)

    def raw_prompt(self, definition) -> bool:
        """A raw prompt is tokenized as it is (special tokens parsed), without the chat template."""
        return not definition.rerank

    def thinking_modes(self, definition):
        return list(THINKING_ALL) if definition.prompt_format == "gemma4_template" else ["default"]

    def sampling_options(self, definition):
        """All of them: the sampler chain (sampling.py) and native.py's token_logprobs."""
        return list(SAMPLING_OPTIONS)

    def reasoning_tags(self, definition, base_dir):
        """As the base, and ``<think>``/``</think>`` when the GGUF's own chat template (with
        prompt_format gguf_template) writes both tags, as Qwen3's and DeepSeek-R1's do."""
        tags = super().reasoning_tags(definition, base_dir)
        if tags is not None or definition.reasoning_tags is not None:
            return tags
        if (definition.prompt_format or "gguf_template") != "gguf_template":
            return None
        path = locate_model_file(definition.model_path, base_dir)
        try:
            template = read_gguf_info(path).chat_template if path and os.path.isfile(path) else None
        except (OSError, GgufError):
            return None
        return THINK_TAGS if template and all(tag in template for tag in THINK_TAGS) else None

    def create_engine(self, model_name, config, replica_index, context):
        return LlamaCppEngine(model_name, config, replica_index, context)

    def warm_up(self) -> None:
        native()  # maps libllama and initialises its backend

    def default_device(self, definition) -> str:
        """No layers offloaded: the model lives in RAM (runtime.pool.memory charges cpu)."""
        return "cpu" if definition.gguf_n_gpu_layers == 0 else "auto"

    def estimate_parts(self, definition, config, base_dir):
        """One replica (``gguf_estimate_parts``) at the effective cache types and a KV cache of
        ``target_inflight`` sequences of n_ctx cells each (``kv_cells``), with
        layers on a GPU the process's GPU overhead, on ``cpu`` (no GPU layers, or placed there)
        its vocabulary and, in an engine process, the process itself
        (``ENGINE_PROCESS_BASELINE_MIB``).  bench/memory.py measures the cpu figures against
        the engine process's RSS; docs/settings.md has them, and the GPU one."""
        path = locate_model_file(definition.model_path, base_dir)
        if path is None or not os.path.isfile(path):
            return None
        try:
            info = read_gguf_info(path)
        except OSError:
            return None
        except GgufError:
            info = None
        on_gpu = layers_on_gpu(config["gguf_n_gpu_layers"], config.get("device"))
        parts = gguf_estimate_parts(
            path, info, kv_cells(config), config["gguf_type_k"], config["gguf_type_v"], on_gpu=on_gpu
        )
        if not on_gpu and config["isolation"] == "process":
            parts["overhead_mib"] += ENGINE_PROCESS_BASELINE_MIB
        draft = self._draft_parts(config, base_dir, on_gpu)
        if draft is not None:  # draft-simple: a second model and context in the same process
            for part in ("weights_mib", "kv_cache_mib", "compute_mib"):
                parts[part] += draft[part]
        return parts

    @staticmethod
    def _draft_parts(config, base_dir, on_gpu: bool) -> dict | None:
        """The draft model's weights, KV cache (the target's cells and types) and compute margin;
        None without a readable draft model."""
        found = gguf_file(config.get("gguf_spec_draft_model"), base_dir)
        if config.get("gguf_spec_type") != "draft-simple" or found is None:
            return None
        return gguf_estimate_parts(*found, kv_cells(config), config["gguf_type_k"], config["gguf_type_v"],
                                   on_gpu=on_gpu)

    def vram_estimate(self, definition, config, replicas, base_dir):
        """Per replica: the GGUF file plus its KV cache (``kv_cells``) at the effective cache types.

        A file whose header cannot be read as GGUF counts with its size alone; a missing file
        makes the estimate unavailable.
        """
        path = locate_model_file(definition.model_path, base_dir)
        if path is None or not os.path.isfile(path):
            return None, "unavailable"
        try:
            info = read_gguf_info(path)
        except OSError:
            return None, "unavailable"
        except GgufError:
            size, cache = os.path.getsize(path), 0
        else:
            size = info.file_size
            cache = info.kv_cache_bytes(kv_cells(config), config["gguf_type_k"], config["gguf_type_v"]) or 0
        per_replica = -(-(size + cache) // (1024 * 1024))
        return per_replica * replicas, "model_artifact_size"
