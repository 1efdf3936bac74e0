"""llama-server's speculative decoding: its ``--spec-type`` modes, the flags each takes, and
which definition fields apply to which mode.

One field names the mode (``llama_server_spec_type``) and a few name its knobs the same way
across modes, mapped to the flags of that mode (llama.cpp's ``common/arg.cpp``):

* ``llama_server_spec_draft_n_max``: the longest draft of a draft model or MTP head
  (``--spec-draft-n-max``), 1 to 6 as the contract bounds it.
* ``llama_server_spec_ngram_n_max``: the longest draft of an n-gram mode: ngram-mod's
  ``--spec-ngram-mod-n-max``, the m-gram a lookup mode proposes (``--spec-ngram-<mode>-size-m``).
* ``llama_server_spec_draft_n_min``: the shortest draft worth verifying (``--spec-draft-n-min``,
  ``--spec-ngram-mod-n-min``).
* ``llama_server_spec_draft_p_min``: a draft model stops drafting below this probability.
* ``llama_server_spec_ngram_size_n``: the n-gram a lookup mode matches (``--spec-ngram-<mode>-size-n``,
  ngram-mod's ``--spec-ngram-mod-n-match``).
* ``llama_server_spec_ngram_min_hits``: how often an n-gram must have been seen.

A field the chosen mode has no flag for is refused, never dropped in silence.
"""
from __future__ import annotations

from typing import Any

# The modes of llama.cpp's common_speculative_type_from_name_map, "none" aside.
DRAFT_MODEL_TYPES = ("draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark")  # need a draft GGUF
MTP_TYPE = "draft-mtp"  # the target's own MTP head, or a draft GGUF holding one
LOOKUP_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v")  # the n-gram lookups: size n, size m, hits
NGRAM_MOD = "ngram-mod"
NGRAM_CACHE = "ngram-cache"
SPEC_TYPES = (*DRAFT_MODEL_TYPES, MTP_TYPE, *LOOKUP_TYPES, NGRAM_MOD, NGRAM_CACHE)

KNOBS = ("spec_draft_n_max", "spec_ngram_n_max", "spec_draft_n_min", "spec_draft_p_min", "spec_ngram_size_n",
         "spec_ngram_min_hits")
# The knobs each mode takes: knob -> its flag.
_DRAFT_FLAGS = {
    "spec_draft_n_max": "--spec-draft-n-max",
    "spec_draft_n_min": "--spec-draft-n-min",
    "spec_draft_p_min": "--spec-draft-p-min",
}


def _lookup_flags(mode: str) -> dict[str, str]:
    stem = "--spec-" + mode
    return {"spec_ngram_n_max": f"{stem}-size-m", "spec_ngram_size_n": f"{stem}-size-n",
            "spec_ngram_min_hits": f"{stem}-min-hits"}


FLAGS: dict[str, dict[str, str]] = {
    **{mode: _DRAFT_FLAGS for mode in (*DRAFT_MODEL_TYPES, MTP_TYPE)},
    **{mode: _lookup_flags(mode) for mode in LOOKUP_TYPES},
    NGRAM_MOD: {"spec_ngram_n_max": "--spec-ngram-mod-n-max", "spec_draft_n_min": "--spec-ngram-mod-n-min",
                "spec_ngram_size_n": "--spec-ngram-mod-n-match"},
    NGRAM_CACHE: {},
}


def spec_problem(config: dict[str, Any]) -> tuple[str, str] | None:
    """``(field, why)`` when ``config``'s speculative fields do not fit together, else None:
    a knob without a mode or one its mode has no flag for, a draft-model mode without
    ``llama_server_draft_model``, or a shortest draft longer than the longest."""
    mode = config.get("llama_server_spec_type")
    set_knobs = [knob for knob in KNOBS if config.get(f"llama_server_{knob}") is not None]
    if mode is None:
        if set_knobs:
            return f"llama_server_{set_knobs[0]}", f"llama_server_{set_knobs[0]} needs llama_server_spec_type"
        return None
    for knob in set_knobs:
        if knob not in FLAGS[mode]:
            return f"llama_server_{knob}", f"llama_server_{knob} does not apply to llama_server_spec_type {mode}"
    if mode in DRAFT_MODEL_TYPES and config.get("llama_server_draft_model") is None:
        return "llama_server_spec_type", f"llama_server_spec_type {mode} needs llama_server_draft_model (a draft GGUF)"
    longest = "spec_ngram_n_max" if mode == NGRAM_MOD else "spec_draft_n_max"
    n_max, n_min = config.get(f"llama_server_{longest}"), config.get("llama_server_spec_draft_n_min")
    if n_max is not None and n_min is not None and n_min > n_max:
        return "llama_server_spec_draft_n_min", (
            f"llama_server_spec_draft_n_min ({n_min}) must not exceed llama_server_{longest} ({n_max})")
    return None


def spec_args(config: dict[str, Any]) -> list[str]:
    """``--spec-type <mode>`` and the flag of each knob set, in ``KNOBS`` order (none without a mode)."""
    mode = config.get("llama_server_spec_type")
    if mode is None:
        return []
    args = ["--spec-type", mode]
    for knob, flag in FLAGS[mode].items():
        value = config.get(f"llama_server_{knob}")
        if value is not None:
            args += [flag, str(value)]
    return args
