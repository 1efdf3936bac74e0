"""ct2: CTranslate2 generator models, by default in an engine process per replica.

This module holds the definition schema; ct2 has no live-load overrides.  The
engine (``runtime.backends.ct2.engine``) loads one ``ctranslate2.Generator`` per
replica; ``device`` null lets CTranslate2 pick (``auto``), ``"cuda:1"`` selects a GPU.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from runtime.backends.shared.in_process import LibrarySpec
from runtime.backends.shared.common_fields import (
    QWEN3,
    FamilyDefinition,
    LibraryFields,
    thinking_for_families,
)
from runtime.backends.ct2.engine import Ct2Engine, import_ctranslate2

Ct2ComputeType = Literal[
    "default",
    "auto",
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
    "float32",
]


class Ct2Definition(LibraryFields, FamilyDefinition):
    backend: Literal["ct2"]
    ct2_compute_type: Ct2ComputeType = "default"
    ct2_inter_threads: int = Field(1, ge=1)
    ct2_intra_threads: int = Field(0, ge=0)  # 0: CTranslate2 picks
    ct2_max_batch_size: int = Field(0, ge=0)  # 0: no limit
    # Folder holding the Hugging Face tokenizer files; null: the model folder.
    ct2_tokenizer_path: str | None = None


class Ct2Spec(LibrarySpec, engine=Ct2Engine, library=import_ctranslate2):
    name = "ct2"
    definition_model = Ct2Definition

    def multi_turn(self, definition) -> bool:
        """The contract lists multi-turn messages only for the chat-serving backends."""
        return False

    def raw_prompt(self, definition) -> bool:
        """A raw prompt is tokenized as it is (special tokens parsed), without the chat template."""
        return True

    def thinking_modes(self, definition):
        return thinking_for_families(definition, (QWEN3,))

    def sampling_options(self, definition):
        """``top_k`` (``sampling_topk``) and ``repeat_penalty`` (``repetition_penalty``, llama.cpp's
        multiplicative penalty of the tokens seen).  No seed: CTranslate2's generator has no
        per-request one (ctranslate2.set_random_seed is process-wide, and set before each
        generation it did not make two samples alike on 4.8.5); its repetition_penalty is not
        OpenAI's presence or frequency penalty, and its log probabilities come without the
        alternatives."""
        return ["top_k", "repeat_penalty"]



