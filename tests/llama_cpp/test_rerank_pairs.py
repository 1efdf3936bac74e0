"""llama_cpp's rerank pieces on the tiny reranker GGUF (tests/llama_cpp/reranker_gguf.py), in
process: the pair layout of llama-server's ``format_prompt_rerank`` token by token (the
vocabulary's BOS, EOS and SEP; the GGUF's rerank template instead when it has one), and the
scores of a rank-pooled context: one per pair, its pair's alone, the tokens counted."""
from __future__ import annotations

import pytest

from runtime.backends.llama_cpp.native import ContextSettings, GgufContext, GgufWeights
from runtime.backends.llama_cpp.rerank import PairLayout, context_pooling, score_pairs
from runtime.errors import ContextLengthExceeded
from runtime.pool.gguf_info import read_gguf_info
from tests.llama_cpp.reranker_gguf import CLS, SEP, SPECIAL, WORDS, write_reranker_gguf

TEMPLATE = "[CLS]{document}[SEP]{query}[SEP]"


def word(text: str) -> int:
    return len(SPECIAL) + WORDS.index(text)


@pytest.fixture(scope="module", params=[None, TEMPLATE], ids=["layout", "template"])
def reranker(tmp_path_factory, request):
    path = str(write_reranker_gguf(tmp_path_factory.mktemp("reranker") / "r.gguf", rerank_template=request.param))
    info = read_gguf_info(path)
    weights = GgufWeights(path, 0)
    settings = ContextSettings(n_ctx=512, n_batch=16, n_threads=1, flash_attn="off", type_k=None, type_v=None,
                               pooling=context_pooling({"rerank": True}, info, path))
    context = GgufContext(weights, settings)
    yield weights, context, PairLayout.of(weights, info), request.param
    context.close()
    weights.close()


def test_the_pair_is_laid_out_as_llama_server_lays_it_out(reranker):
    weights, _, layout, template = reranker
    query, document = [word("cat"), word("sat")], [word("the"), word("mat")]
    if template is None:
        assert (layout.bos, layout.eos, layout.sep) == (CLS, SEP, SEP)
        expected = [CLS, *query, SEP, SEP, *document, SEP]
    else:
        assert layout.template == TEMPLATE
        expected = [CLS, *document, SEP, *query, SEP]
    assert layout.tokens(weights, "cat sat", "the mat") == expected


def test_one_score_per_pair_each_its_own(reranker):
    weights, context, layout, _ = reranker
    documents = ["the cat sat on the mat", "quantum physics", "cat"]
    scores, tokens = score_pairs(weights, context, layout, "where does the cat sleep", documents, lambda: False, "m")
    alone, _ = score_pairs(weights, context, layout, "where does the cat sleep", documents[2:], lambda: False, "m")
    assert len(scores) == 3 and len(set(scores)) == 3
    assert alone == scores[2:]
    extra = 4 if layout.template is None else 3  # [CLS] [SEP] [SEP] [SEP], or the template's three
    assert tokens == sum(5 + len(document.split()) + extra for document in documents)


def test_a_pair_over_one_batch_is_refused(reranker):
    weights, context, layout, _ = reranker
    with pytest.raises(ContextLengthExceeded) as refused:
        score_pairs(weights, context, layout, "cat " * 20, ["dog"], lambda: False, "m")
    assert refused.value.param == "documents"
