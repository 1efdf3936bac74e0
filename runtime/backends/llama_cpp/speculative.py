"""Speculative decoding in the batch loop: a cheap guess of the next few tokens of a sequence,
checked by the target model in the same ``llama_decode`` that computes its next token.

Each step, a sequence that answers puts its pending token and up to ``gguf_spec_draft_n_max``
draft tokens into the batch, every one with its logits.  The target's own sampler then samples
at each of them in turn: while what it samples is the next draft token, that token is accepted
(it is already in the KV cache, at the right position); the first token it samples that differs
is the answer's next token, and the draft tokens after it are cut from the sequence
(``llama_memory_seq_rm``), as llama-server's ``common_sampler_sample_and_accept_n`` does.  Every
token of the answer is thus one the target's sampler chose from the target's logits: at
temperature 0 plain decoding's answer, as far as llama.cpp computes the same logits for a
position in a batch of several as alone (docs/backends/llama_cpp.md, "Same answers").

Where drafts come from (``gguf_spec_type``):

* ``ngram-simple`` (prompt lookup, llama.cpp's ``common_ngram_simple_draft``): the last
  ``gguf_spec_ngram_size_n`` tokens are looked for earlier in the prompt and the answer; the
  tokens that followed their latest match are the draft, where at least as many follow it.  No
  second model: it pays off where the answer repeats its input (code edits, tables, extraction).
  Shorter n-grams are not tried: a one- or two-token match drafts often and is seldom right, so
  the verification costs more than it saves.
* ``draft-simple``: a small model on the same vocabulary (``gguf_spec_draft_model``) drafts
  greedily, stopping where its best token's probability falls under ``gguf_spec_draft_p_min``
  (``runtime.backends.llama_cpp.draft_model``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from runtime.errors import BackendError

logger = logging.getLogger("llmpool.llama_cpp")

SPEC_TYPES = ("ngram-simple", "draft-simple")


@dataclass(frozen=True)
class SpeculationSettings:
    """What one replica drafts with; ``spec_type`` None: no speculative decoding."""

    spec_type: str | None
    n_max: int = 8
    p_min: float = 0.0
    ngram_size_n: int = 3

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SpeculationSettings:
        return cls(config.get("gguf_spec_type"), config.get("gguf_spec_draft_n_max") or 8,
                   config.get("gguf_spec_draft_p_min") or 0.0, config.get("gguf_spec_ngram_size_n") or 3)


def speculation_problem(config: dict[str, Any]) -> tuple[str, str] | None:
    """``(field, why)`` when ``draft-simple`` is asked for without a draft model, else None."""
    if config.get("gguf_spec_type") == "draft-simple" and not config.get("gguf_spec_draft_model"):
        return "gguf_spec_type", "gguf_spec_type draft-simple needs gguf_spec_draft_model (a GGUF on the same vocabulary)"
    return None


class NgramDrafter:
    """Prompt lookup for one answer: where the latest occurrence of each ``size_n``-gram of the
    history was followed by a token (indexed as the history grows)."""

    def __init__(self, size_n: int, n_max: int):
        self.size_n = size_n
        self.n_max = n_max
        self._next: dict[tuple[int, ...], int] = {}  # n-gram -> the position after its latest occurrence
        self._indexed = 0  # positions of the history whose preceding n-gram is indexed

    def propose(self, history: list[int], limit: int) -> list[int]:
        """llama.cpp's ``common_ngram_simple_draft`` with ``size_n`` and ``n_max`` (its n-gram and
        m-gram), then cut to ``limit``: the tokens that followed the latest earlier match of the
        history's last ``size_n`` tokens (the last one is the token being decoded, never drafted),
        up to ``n_max``; [] when the history is not longer than ``size_n + n_max + 2``, when there
        is no match, or when fewer than ``size_n`` tokens can be copied.  As there, the match that
        ends one token before the current n-gram and one at position 0 do not count."""
        n, end = self.size_n, len(history)
        if limit <= 0 or end - 1 <= n + self.n_max + 1:
            return []
        self._index(history)
        start = self._next.get(tuple(history[end - n:]))
        if start is None:
            return []
        copy = min(self.n_max, end - 1 - start)
        return history[start:start + min(copy, limit)] if copy >= n else []

    def _index(self, history: list[int]) -> None:
        """Index each position ``j`` (the token after the n-gram that ends at ``j - 1``) from
        ``size_n + 1`` (an n-gram at position 0 is no match) to the last but one: the n-gram that
        ends there is the current one's neighbour, which llama.cpp's backward search skips."""
        n = self.size_n
        for position in range(max(n + 1, self._indexed), len(history) - 1):
            self._next[tuple(history[position - n:position])] = position
        self._indexed = max(self._indexed, len(history) - 1)


class Speculation:
    """One replica's drafting: ``start`` gives a generation its drafter, ``drafts`` proposes the
    tokens a step verifies (``verify`` keeps what the target agrees with).  ``draft_model`` (for
    ``draft-simple``: a ``draft_model.DraftModel``) is the replica's draft model, None otherwise."""

    def __init__(self, settings: SpeculationSettings, draft_model=None):
        self.settings = settings
        self.draft_model = draft_model

    @property
    def enabled(self) -> bool:
        return self.settings.spec_type is not None

    def close(self) -> None:
        """Free the draft model (the replica unloads); safe twice."""
        if self.draft_model is not None:
            self.draft_model.close()
            self.draft_model = None

    def start(self, generation) -> None:
        if self.settings.spec_type == "ngram-simple":
            generation.drafter = NgramDrafter(self.settings.ngram_size_n, self.settings.n_max)
        elif self.settings.spec_type == "draft-simple" and self.draft_model is not None:
            generation.drafter = self.draft_model

    def drafts(self, context, answering: dict[int, object], room: int) -> dict[int, list[int]]:
        """``{seq: draft tokens}`` to follow the pending token of each of ``answering``
        (``{seq: generation}``): at most ``room`` each (the batch's), the answer's remaining tokens
        less one, and the sequence's room less one."""
        wants = {}
        for seq, generation in answering.items():
            if generation.drafter is None:
                continue
            held = len(context.sequences[seq])
            limit = min(room, self.settings.n_max, generation.request.max_output_tokens - generation.produced - 1,
                        context.n_ctx - held - 2)
            if limit > 0:
                wants[seq] = (context.sequences[seq] + [generation.pending], limit)
        if self.draft_model is not None:
            try:
                return self.draft_model.propose(wants, self.settings.p_min) if wants else {}
            except BackendError:  # a draft that fails costs this step its drafts, never the answers
                logger.exception("the draft model failed; this step decodes without drafts")
                self.draft_model.context.clear()
                return {}
        return {seq: answering[seq].drafter.propose(history, limit) for seq, (history, limit) in wants.items()}


def verify(generation, context, seq: int, indices: list[int], drafts: list[int]) -> bool:
    """Sample at each of ``indices`` (the batch entries of the pending token and each of
    ``drafts``) while the target agrees with the drafts; True when the answer is over.  The
    sequence is cut back to the tokens accepted; the first token the target disagrees with (or
    the one after the last draft) becomes ``pending``."""
    held = len(context.sequences[seq]) - len(drafts)  # the pending token's and those before it
    accepted = 0
    done, token = False, None
    for position, index in enumerate(indices):
        token = generation.sample(context, index)
        done = generation.take(context, token, index, held)
        agreed = position < len(drafts) and token == drafts[position]
        accepted += agreed
        if done or not agreed:
            break
        held += 1  # the draft token the target chose is in the cache already
    generation.drafted += len(drafts)
    generation.accepted_drafts += accepted
    cut(context, seq, held)
    if not done:
        generation.pending = token
    return done


def cut(context, seq: int, keep: int) -> None:
    """Drop sequence ``seq``'s positions from ``keep`` on, in the KV cache and in its tokens."""
    held = context.sequences[seq]
    if keep >= len(held):
        return
    memory = context._lib.llama_get_memory(context.ctx)
    if not context._lib.llama_memory_seq_rm(memory, seq, keep, -1):
        context.clear(seq)  # a memory that cannot cut a sequence: nothing of it is reused
        return
    del held[keep:]
