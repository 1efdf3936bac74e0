"""A tiny reranker GGUF written with the ``gguf`` package: a 2-layer BERT with a classification
head and random (seeded) weights, as llama.cpp's BERT loader reads one.

What makes it a reranker to llama.cpp: architecture ``bert``, ``bert.pooling_type`` 4 (rank),
non-causal attention, and the head's tensors ``cls`` ({n_embd, n_embd}: the pooler, then tanh) and
``cls.output`` ({n_embd, 1}: one score), read by ``llama_model_bert::load_arch_tensors`` and
applied by ``build_pooling`` (src/llama-graph.cpp, LLAMA_POOLING_TYPE_RANK).  The tokenizer is a
WordPiece vocabulary (``tokenizer.ggml.model`` ``bert``): the special tokens, then each word of
``WORDS`` as a word start (``▁word``, the phantom space convert_hf_to_gguf gives BERT vocabularies);
it adds BOS ([CLS]), EOS and SEP ([SEP]), so a pair is ``[CLS] query [SEP] [SEP] document [SEP]``,
the layout of an XLM-RoBERTa reranker (``<s> q </s></s> d </s>``).  Every word of ``WORDS`` is one
token, so a pair of ``q`` and ``d`` words is ``q + d + 4`` tokens.

A ``rerank_template`` is written as ``tokenizer.chat_template.rerank``, the named template
llama-server's ``format_prompt_rerank`` uses in place of that layout.
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = range(len(SPECIAL))
WORDS = (
    "the a of to and in is it cat dog sat on mat rug fish swims sea river bird flies sky tree "
    "where what does do live lives which animal pets sleeps house garden car road drives fast "
    "quantum physics strong force paris capital france city"
).split()
N_EMBD, N_FF, N_HEAD, N_LAYER, N_CTX = 32, 64, 2, 2, 512


def write_reranker_gguf(path: Path, *, seed: int = 7, rerank_template: str | None = None) -> Path:
    rng = numpy.random.default_rng(seed)

    def weight(*shape: int, scale: float = 0.3) -> numpy.ndarray:
        return (rng.standard_normal(shape) * scale).astype(numpy.float32)

    def ones(size: int) -> numpy.ndarray:
        return numpy.ones(size, dtype=numpy.float32)

    def zeros(size: int) -> numpy.ndarray:
        return numpy.zeros(size, dtype=numpy.float32)

    tokens = SPECIAL + ["\u2581" + word for word in WORDS]
    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_block_count(N_LAYER)
    writer.add_head_count(N_HEAD)
    writer.add_layer_norm_eps(1e-12)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.RANK)
    writer.add_tokenizer_model("bert")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL] * len(SPECIAL) + [gguf.TokenType.NORMAL] * len(WORDS))
    writer.add_token_type_count(2)
    writer.add_pad_token_id(PAD)
    writer.add_unk_token_id(UNK)
    writer.add_bos_token_id(CLS)
    writer.add_eos_token_id(SEP)
    writer.add_sep_token_id(SEP)
    writer.add_mask_token_id(MASK)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    writer.add_add_sep_token(True)
    if rerank_template is not None:
        writer.add_chat_template([{"name": "rerank", "template": rerank_template}])

    # numpy shapes are ggml's reversed: a {n_embd, n_vocab} tensor is (n_vocab, n_embd).
    writer.add_tensor("token_embd.weight", weight(len(tokens), N_EMBD))
    writer.add_tensor("token_types.weight", weight(2, N_EMBD))
    writer.add_tensor("position_embd.weight", weight(N_CTX, N_EMBD, scale=0.05))
    writer.add_tensor("token_embd_norm.weight", ones(N_EMBD))
    writer.add_tensor("token_embd_norm.bias", zeros(N_EMBD))
    for layer in range(N_LAYER):
        block = f"blk.{layer}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{block}.{name}.weight", weight(N_EMBD, N_EMBD))
            writer.add_tensor(f"{block}.{name}.bias", zeros(N_EMBD))
        writer.add_tensor(f"{block}.attn_output_norm.weight", ones(N_EMBD))
        writer.add_tensor(f"{block}.attn_output_norm.bias", zeros(N_EMBD))
        writer.add_tensor(f"{block}.ffn_up.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"{block}.ffn_up.bias", zeros(N_FF))
        writer.add_tensor(f"{block}.ffn_down.weight", weight(N_EMBD, N_FF))
        writer.add_tensor(f"{block}.ffn_down.bias", zeros(N_EMBD))
        writer.add_tensor(f"{block}.layer_output_norm.weight", ones(N_EMBD))
        writer.add_tensor(f"{block}.layer_output_norm.bias", zeros(N_EMBD))
    writer.add_tensor("cls.weight", weight(N_EMBD, N_EMBD))
    writer.add_tensor("cls.bias", zeros(N_EMBD))
    writer.add_tensor("cls.output.weight", weight(1, N_EMBD, scale=1.0))
    writer.add_tensor("cls.output.bias", zeros(1))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
