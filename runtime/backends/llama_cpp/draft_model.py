"""The draft model of ``draft-simple`` speculative decoding: a second, smaller GGUF on the
target's vocabulary, with a context of its own that mirrors the target's sequences.

Each step of the batch loop asks it for the drafts of every answering sequence at once
(``propose``): one batch brings each sequence's draft cache up to the sequence's accepted tokens
(what it holds beyond them, the rejected drafts of the last step, is cut first), then one batch
per draft position decodes every sequence's latest draft token, greedily, until a sequence has
its ``limit`` or its best token's probability falls under ``p_min`` (llama.cpp's ``--draft-p-min``).
Runs on the replica's worker thread, as the target does.
"""
from __future__ import annotations

import math

from runtime.backends.llama_cpp.native import ContextSettings, EngineLoadError, GgufContext, GgufWeights, common_prefix
from runtime.backends.llama_cpp.speculative import cut
from runtime.pool.model_files import ModelFileError, resolve_model_file


class DraftModel:
    """The draft weights and their context (``settings``: the target's, for its sequences and sizes)."""

    def __init__(self, path: str, n_gpu_layers: int, settings: ContextSettings, target: GgufWeights, main_gpu: int = 0):
        self.weights = GgufWeights(path, n_gpu_layers, main_gpu=main_gpu)
        if self.weights.n_vocab != target.n_vocab:
            self.weights.close()
            raise EngineLoadError(f"the draft model {path} has {self.weights.n_vocab} tokens in its vocabulary, the "
                                  f"model {target.n_vocab}: a draft model must share the model's vocabulary")
        try:
            self.context = GgufContext(self.weights, ContextSettings(
                settings.n_ctx, settings.n_batch, settings.n_threads, settings.flash_attn, settings.type_k,
                settings.type_v, n_seq=settings.n_seq))
        except BaseException:
            self.weights.close()
            raise

    @classmethod
    def of_config(cls, config: dict, base_dir: str, settings: ContextSettings, target: GgufWeights,
                  main_gpu: int) -> DraftModel:
        """``gguf_spec_draft_model`` on the target's GPU layers and context settings (EngineLoadError
        where it cannot be read, or its vocabulary is not the target's)."""
        try:
            path = resolve_model_file(config["gguf_spec_draft_model"], base_dir)
        except ModelFileError as exc:
            raise EngineLoadError(f"gguf_spec_draft_model: {exc}") from None
        return cls(path, config["gguf_n_gpu_layers"], settings, target, main_gpu=main_gpu)

    def propose(self, wants: dict[int, tuple[list[int], int]], p_min: float) -> dict[int, list[int]]:
        """``{seq: draft}`` for ``wants`` (``{seq: (its accepted tokens and pending one, the most to draft)}``);
        a sequence whose tokens do not all fit this step's catch-up batch drafts nothing this step."""
        context = self.context
        live = self._catch_up(wants)
        drafts: dict[int, list[int]] = {seq: [] for seq in live}
        while live:
            batch = context.batch
            batch.clear()
            appended, following = {}, {}
            for seq, index in live.items():
                token, probability = self._best(index)
                if probability < p_min:
                    continue
                drafts[seq].append(token)
                if len(drafts[seq]) < wants[seq][1]:
                    following[seq] = batch.add(token, len(context.sequences[seq]), seq, True)
                    appended[seq] = [token]
            if appended:
                context.decode_batch(appended)
            live = following
        return drafts

    def _catch_up(self, wants: dict[int, tuple[list[int], int]]) -> dict[int, int]:
        """Decode what each sequence's draft cache lacks of its tokens; ``{seq: batch entry of its
        last token}`` for those that now hold them all and have room for a draft."""
        context = self.context
        batch = context.batch
        batch.clear()
        appended, outputs = {}, {}
        for seq, (history, limit) in wants.items():
            if limit <= 0 or len(history) + limit > context.n_ctx:
                continue
            keep = min(common_prefix(context.sequences[seq], history), len(history) - 1)
            cut(context, seq, keep)
            keep = len(context.sequences[seq])
            missing = history[keep:]
            room = context.n_batch - len(batch)
            if room <= 0:
                break
            chunk = missing[:room]
            index = batch.add_run(chunk, keep, seq, logits_last=len(chunk) == len(missing))
            appended[seq] = chunk
            if len(chunk) == len(missing):
                outputs[seq] = index
        if appended:
            context.decode_batch(appended)
        return outputs

    def _best(self, index: int) -> tuple[int, float]:
        """The draft's most likely token at batch entry ``index`` and its probability."""
        import numpy

        context = self.context
        logits = numpy.ctypeslib.as_array(context._lib.llama_get_logits_ith(context.ctx, index),
                                          shape=(self.weights.n_vocab,))
        token = int(numpy.argmax(logits))
        top = float(logits[token])
        total = float(numpy.exp(logits - top).sum())
        return token, 1.0 / total if math.isfinite(total) and total > 0 else 0.0

    def close(self) -> None:
        self.context.close()
        self.weights.close()
