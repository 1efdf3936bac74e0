"""What one generation samples with: the options and llama.cpp's sampler chain built from them.

The chain is made fresh for every generation (its penalties and grammar state belong to that
answer alone), so a context whose KV cache is kept between requests carries no sampling state.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from runtime.errors import BackendError


@dataclass(frozen=True)
class SamplingOptions:
    """What one generation samples with; ``seed`` None draws a random one; ``top_k`` 0 keeps
    every token; ``repeat_penalty`` 1.0 is none; ``grammar`` (GBNF, rule ``root``) constrains
    every token."""

    temperature: float
    top_p: float
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_k: int = 0
    repeat_penalty: float = 1.0
    grammar: str | None = None


def grammar_of_schema(schema: dict) -> str:
    """The GBNF grammar of JSON ``schema``, by llama-cpp-python's converter (llama.cpp's
    json_schema_to_grammar); raises ValueError for a schema it cannot convert."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as exc:  # the converter raises what it meets (KeyError, TypeError, ValueError ...)
        raise ValueError(f"{type(exc).__name__}: {exc}") from None


class Sampler:
    """A llama.cpp sampler chain, in the order of llama-cpp-python's ``_init_sampler``: the
    repeat, presence and frequency penalties (over every token generated so far, none of the
    prompt's) when set, the grammar when there is one (it keeps only the tokens it allows, and
    only end-of-generation once it is complete; ``llama_sampler_sample`` advances it with each
    token), then greedy at temperature 0, else top-k, top-p, temperature and a draw seeded with
    ``seed`` (taken modulo 2**32 - 1, as llama.cpp's seed is an unsigned 32-bit number whose
    highest value means "random")."""

    def __init__(self, lib, options: SamplingOptions, n_vocab: int, n_ctx: int, vocab=None):
        self._lib = lib
        self.chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        if options.presence_penalty or options.frequency_penalty or options.repeat_penalty != 1.0:
            lib.llama_sampler_chain_add(self.chain, lib.llama_sampler_init_penalties(
                n_vocab, n_ctx, options.repeat_penalty, options.frequency_penalty, options.presence_penalty
            ))
        if options.grammar is not None:
            grammar = lib.llama_sampler_init_grammar(vocab, options.grammar.encode("utf-8"), b"root")
            if not grammar:
                lib.llama_sampler_free(self.chain)
                self.chain = None
                raise BackendError("llama.cpp could not parse the grammar built from the tools' schemas")
            lib.llama_sampler_chain_add(self.chain, grammar)
        if options.temperature <= 0:
            lib.llama_sampler_chain_add(self.chain, lib.llama_sampler_init_greedy())
        else:
            if options.top_k > 0:
                lib.llama_sampler_chain_add(self.chain, lib.llama_sampler_init_top_k(options.top_k))
            if options.top_p < 1.0:
                lib.llama_sampler_chain_add(self.chain, lib.llama_sampler_init_top_p(options.top_p, 1))
            lib.llama_sampler_chain_add(self.chain, lib.llama_sampler_init_temp(options.temperature))
            seed = lib.LLAMA_DEFAULT_SEED if options.seed is None else options.seed % lib.LLAMA_DEFAULT_SEED
            lib.llama_sampler_chain_add(self.chain, lib.llama_sampler_init_dist(seed))

    def sample(self, context, index: int = -1) -> int:
        """The next token from the logits of batch entry ``index`` of the last decode (-1: its last)."""
        return self._lib.llama_sampler_sample(self.chain, context.ctx, index)

    def close(self) -> None:
        if self.chain:
            self._lib.llama_sampler_free(self.chain)
            self.chain = None


def token_logprobs(context, token: int, top: int, index: int = -1) -> dict:
    """The chat completions logprobs entry of ``token``, just sampled from the logits of batch
    entry ``index`` of the last decode: its log-probability under the model (llama-cpp-python's
    ``logits_to_logprobs``, as its ``create_completion`` reports them) and the ``top`` most
    likely tokens'."""
    import numpy

    lib, weights = context._lib, context.weights
    logits = numpy.ctypeslib.as_array(lib.llama_get_logits_ith(context.ctx, index), shape=(weights.n_vocab,))
    logprobs = lib.Llama.logits_to_logprobs(logits)
    best = numpy.argpartition(-logprobs, top - 1)[:top] if top else ()
    ranked = sorted(best, key=lambda candidate: -logprobs[candidate])
    return {**_entry(weights, token, logprobs),
            "top_logprobs": [_entry(weights, int(candidate), logprobs) for candidate in ranked]}


def _entry(weights, token: int, logprobs) -> dict:
    piece = weights.piece(token)
    return {"token": piece.decode("utf-8", errors="replace"), "logprob": float(logprobs[token]), "bytes": list(piece)}
