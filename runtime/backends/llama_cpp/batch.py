"""A ``llama_batch`` of tokens from several sequences, filled and decoded again and again.

llama-server's ``common_batch_add`` in Python: each token carries its position, the one sequence
it belongs to and whether its logits are wanted; a token whose logits are wanted is read back
by its index in the batch (``llama_get_logits_ith``, ``llama_sampler_sample``).
"""
from __future__ import annotations

from runtime.errors import BackendError


class TokenBatch:
    """A batch of at most ``capacity`` tokens, allocated once (``llama_batch_init``) and freed by ``close``."""

    def __init__(self, lib, capacity: int):
        self._lib = lib
        self.capacity = capacity
        self.batch = lib.llama_batch_init(capacity, 0, 1)
        self.batch.n_tokens = 0

    def __len__(self) -> int:
        return self.batch.n_tokens

    def clear(self) -> None:
        self.batch.n_tokens = 0

    def add(self, token: int, position: int, seq: int, logits: bool) -> int:
        """Append ``token`` at ``position`` of sequence ``seq``; returns its index in the batch."""
        batch = self.batch
        index = batch.n_tokens
        if index >= self.capacity:
            raise BackendError(f"a batch of {self.capacity} tokens is full")
        batch.token[index] = token
        batch.pos[index] = position
        batch.n_seq_id[index] = 1
        batch.seq_id[index][0] = seq
        batch.logits[index] = logits
        batch.n_tokens = index + 1
        return index

    def add_run(self, tokens: list[int], start: int, seq: int, logits_last: bool) -> int:
        """Append ``tokens`` at positions ``start``… of sequence ``seq``, the last one's logits
        wanted when ``logits_last``; returns the last one's index."""
        index = -1
        for offset, token in enumerate(tokens):
            index = self.add(token, start + offset, seq, logits_last and offset == len(tokens) - 1)
        return index

    def decode(self, ctx) -> None:
        """``llama_decode`` the batch; raises BackendError when llama.cpp refuses it."""
        status = self._lib.llama_decode(ctx, self.batch)
        if status != 0:
            raise BackendError(f"llama.cpp could not decode {len(self)} tokens (llama_decode returned {status})")

    def close(self) -> None:
        if self.batch is not None:
            self._lib.llama_batch_free(self.batch)
            self.batch = None
