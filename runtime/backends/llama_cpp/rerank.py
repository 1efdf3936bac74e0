"""Reranking on a llama.cpp context with rank pooling, as llama-server's /v1/rerank does it.

Each (query, document) pair is one sequence, laid out as llama-server's ``format_prompt_rerank``
(tools/server/server-common.cpp) lays it out, so the two engines score a pair alike:

* the GGUF's ``tokenizer.chat_template.rerank`` when it has one: ``{query}`` and ``{document}``
  replaced in it, the whole tokenized with special tokens parsed and none added;
* otherwise ``[BOS] query [EOS] [SEP] document [EOS]``: the query and the document tokenized as
  plain text, BOS where the vocabulary adds one, EOS (SEP where the vocabulary has no EOS) and
  SEP where it adds them.

The pair's score is the first value of the sequence's rank-pooled output
(``llama_get_embeddings_seq``: the classification head over the pooled token, as llama-server
reads it), unbounded, with no sigmoid applied.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from runtime.backends.llama_cpp.native import EngineLoadError, GgufContext, GgufWeights, native
from runtime.errors import BackendError, ContextLengthExceeded
from runtime.pool.gguf_info import GgufInfo

RERANK_TEMPLATE_KEY = "tokenizer.chat_template.rerank"
_TOKEN_NULL = -1  # LLAMA_TOKEN_NULL


def context_pooling(config: dict, info: GgufInfo, path: str) -> str | None:
    """How a replica's context pools: ``rank`` for a reranker (``rerank: true``, which needs a GGUF
    that declares rank pooling: its classification head), the embedding pooling for
    ``embeddings: true``, else None (a context that only generates)."""
    if config.get("rerank"):
        if info.pooling_type != "rank":
            raise EngineLoadError(
                f"{path} is not a reranker: its GGUF declares pooling_type {info.pooling_type or 'none'}, "
                "and rerank: true needs rank (a model converted with its classification head)"
            )
        return "rank"
    return info.embedding_pooling if config.get("embeddings") else None


@dataclass(frozen=True)
class PairLayout:
    """How a reranker's vocabulary lays a (query, document) pair out (``format_prompt_rerank``)."""

    template: str | None
    bos: int | None  # None: the vocabulary adds no BOS
    eos: int | None  # the end token, or None where the vocabulary adds none
    sep: int | None  # None: the vocabulary adds no SEP

    @classmethod
    def of(cls, weights: GgufWeights, info: GgufInfo) -> PairLayout:
        lib = native()
        vocab = weights.vocab
        template = info.metadata.get(RERANK_TEMPLATE_KEY)
        eos = lib.llama_vocab_eos(vocab)
        if eos == _TOKEN_NULL:
            eos = lib.llama_vocab_sep(vocab)
        return cls(
            template=template if isinstance(template, str) else None,
            bos=lib.llama_vocab_bos(vocab) if lib.llama_vocab_get_add_bos(vocab) else None,
            eos=eos if lib.llama_vocab_get_add_eos(vocab) else None,
            sep=lib.llama_vocab_sep(vocab) if lib.llama_vocab_get_add_sep(vocab) else None,
        )

    def tokens(self, weights: GgufWeights, query: str, document: str) -> list[int]:
        if self.template is not None:
            prompt = self.template.replace("{query}", query).replace("{document}", document)
            return weights.tokenize(prompt, parse_special=True, add_special=False)
        query_tokens = weights.tokenize(query, parse_special=False, add_special=False)
        document_tokens = weights.tokenize(document, parse_special=False, add_special=False)
        return [
            *_maybe(self.bos), *query_tokens, *_maybe(self.eos), *_maybe(self.sep), *document_tokens, *_maybe(self.eos),
        ]


def _maybe(token: int | None) -> list[int]:
    return [] if token is None else [token]


def score_pairs(weights: GgufWeights, context: GgufContext, layout: PairLayout, query: str, documents: list[str],
                stopped: Callable[[], bool], model_name: str) -> tuple[list[float], int]:
    """The score of each document against ``query`` and the tokens read, on the engine's worker
    thread; ``stopped()`` is asked before each pair (a cancelled request ends there)."""
    scores, total = [], 0
    for index, document in enumerate(documents):
        if stopped():
            raise BackendError("the rerank request was cancelled")
        tokens = layout.tokens(weights, query, document)
        if len(tokens) > context.n_ubatch:
            raise ContextLengthExceeded(
                f"the query with documents[{index}] is {len(tokens)} tokens but model {model_name} scores at most "
                f"{context.n_ubatch} tokens per pair (gguf_n_batch, within gguf_n_ctx)",
                param="documents",
            )
        scores.append(float(context.embed(tokens)[0]))
        total += len(tokens)
    return scores, total
