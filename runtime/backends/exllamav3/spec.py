"""exllamav3: EXL3 models run through ExLlamaV3, by default in an engine process per replica.

This module holds the definition schema and the live-load rules; the engine is
``runtime.backends.exllamav3.engine``.  The KV cache quantisation is one
string, ``exllama_cache_quant`` (null = fp16, ``"8"`` = 8-bit K and V,
``"8,4"`` = 8-bit K, 4-bit V); a load body may instead send
``exllama_cache_k_bits`` and ``exllama_cache_v_bits`` together.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from runtime.backends.shared.in_process import LibrarySpec
from runtime.backends.shared.common_fields import (
    GEMMA4,
    QWEN3,
    FamilyDefinition,
    LibraryFields,
    thinking_for_families,
)
from runtime.backends.exllamav3.engine import ExllamaEngine, import_exllamav3
from runtime.backends.shared.overrides import LoadOverride, integer_override
from runtime.errors import InvalidLoadRequest

CACHE_BITS = list(range(2, 9))
_CACHE_QUANT = re.compile(r"([0-9]+)(?:,([0-9]+))?")
_BIT_FIELDS = ("exllama_cache_k_bits", "exllama_cache_v_bits")


def parse_cache_quant(value: str) -> tuple[int, int]:
    """``"8"`` -> (8, 8), ``"8,4"`` -> (8, 4); ValueError for anything else."""
    match = _CACHE_QUANT.fullmatch(value)
    if match is None:
        raise ValueError(f"exllama_cache_quant must be '<bits>' or '<k_bits>,<v_bits>' (got {value!r})")
    k_bits = int(match.group(1))
    v_bits = int(match.group(2) or k_bits)
    for bits in (k_bits, v_bits):
        if bits not in CACHE_BITS:
            raise ValueError(f"exllama_cache_quant bits must be from 2 through 8 (got {value!r})")
    return k_bits, v_bits


class Exllamav3Definition(LibraryFields, FamilyDefinition):
    backend: Literal["exllamav3"]
    exllama_cache_size: int = Field(8192, ge=256, multiple_of=256)
    exllama_cache_quant: str | None = None
    exllama_max_rq_tokens: int = Field(2048, ge=1)
    # GiB of weights per CUDA device, in device order; null lets ExLlamaV3 place the layers.
    exllama_gpu_split: list[Annotated[float, Field(gt=0)]] | None = None
    exllama_tensor_parallel: bool = False

    @field_validator("exllama_cache_quant")
    @classmethod
    def _cache_quant_format(cls, value: str | None) -> str | None:
        if value is not None:
            parse_cache_quant(value)
        return value


def _bits_constraint() -> dict:
    return {
        "kind": "integer_or_null",
        "minimum": 2,
        "maximum": 8,
        "default": None,
        "null_means": "fp16",
        "allowed_values": list(CACHE_BITS),
    }


class Exllamav3Spec(LibrarySpec, engine=ExllamaEngine, library=import_exllamav3):
    name = "exllamav3"
    definition_model = Exllamav3Definition
    overrides = (
        integer_override("exllama_cache_size", 256, 256),
        integer_override("exllama_max_rq_tokens"),
        LoadOverride("exllama_cache_k_bits", int, _bits_constraint()),
        LoadOverride("exllama_cache_v_bits", int, _bits_constraint()),
        LoadOverride("exllama_cache_quant", str, {"kind": "string_or_null", "format": "<bits>|<k_bits>,<v_bits>"}),
    )

    def multi_turn(self, definition) -> bool:
        """The contract lists multi-turn messages only for the chat-serving backends."""
        return False

    def load_recommendations(self, definition):
        return {
            "exllama_cache_bit_pairs": {
                "kind": "pair_presets",
                "fields": list(_BIT_FIELDS),
                "recommended_pairs": [
                    {"label": "fp16", "exllama_cache_k_bits": None, "exllama_cache_v_bits": None},
                    {"label": "8/8", "exllama_cache_k_bits": 8, "exllama_cache_v_bits": 8},
                    {"label": "8/4", "exllama_cache_k_bits": 8, "exllama_cache_v_bits": 4},
                ],
                "notes": [
                    "Service-curated presets for ExLlamaV3 K/V cache quantization.",
                    "Send exllama_cache_k_bits and exllama_cache_v_bits together; both null means an fp16 cache.",
                ],
            }
        }

    def check_override_combination(self, definition, overrides):
        k_sent, v_sent = (field in overrides for field in _BIT_FIELDS)
        if k_sent != v_sent:
            missing = _BIT_FIELDS[1] if k_sent else _BIT_FIELDS[0]
            raise InvalidLoadRequest(
                "exllama_cache_k_bits and exllama_cache_v_bits must be provided together", param=missing
            )
        if k_sent and "exllama_cache_quant" in overrides:
            raise InvalidLoadRequest(
                "exllama_cache_quant cannot be combined with exllama_cache_k_bits/exllama_cache_v_bits",
                param="exllama_cache_quant",
            )
        if k_sent and (overrides[_BIT_FIELDS[0]] is None) != (overrides[_BIT_FIELDS[1]] is None):
            raise InvalidLoadRequest(
                "exllama_cache_k_bits and exllama_cache_v_bits must both be null (fp16) or both be integers",
                param=_BIT_FIELDS[0],
            )
        quant = overrides.get("exllama_cache_quant")
        if quant is not None:
            try:
                parse_cache_quant(quant)
            except ValueError as exc:
                raise InvalidLoadRequest(str(exc), param="exllama_cache_quant") from exc

    def effective_config(self, definition, overrides: dict[str, Any]) -> dict[str, Any]:
        """As the base, with a k/v bits override folded into ``exllama_cache_quant`` for the engine."""
        bits_sent = _BIT_FIELDS[0] in overrides
        merged = super().effective_config(
            definition, {key: value for key, value in overrides.items() if key not in _BIT_FIELDS}
        )
        if bits_sent:
            k_bits, v_bits = (overrides[field] for field in _BIT_FIELDS)
            merged["exllama_cache_quant"] = None if k_bits is None else f"{k_bits},{v_bits}"
        return merged

    def raw_prompt(self, definition) -> bool:
        """A raw prompt is tokenized as it is (special tokens parsed), without the chat template."""
        return True

    def thinking_modes(self, definition):
        return thinking_for_families(definition, (GEMMA4, QWEN3))

    def sampling_options(self, definition):
        """A seed (``Job(seed=)``) and ComboSampler's OpenAI-style ``pres_p``/``freq_p``, its
        ``rep_p`` (repeat_penalty) and ``top_k``."""
        return ["seed", "presence_penalty", "frequency_penalty", "top_k", "repeat_penalty"]

    def create_engine(self, model_name, config, replica_index, context):
        quant = config["exllama_cache_quant"]
        return ExllamaEngine(config, context, cache_bits=None if quant is None else parse_cache_quant(quant))


