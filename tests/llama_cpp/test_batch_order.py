"""The order of a batch step's entries (batching.BatchLoop._step), without a model: every
sequence's tokens come in increasing sequence order, whatever order the requests were admitted
in.  llama.cpp decodes the sequences of one micro-batch of a per-sequence KV cache only as a run
of consecutive ids (``split_equal``'s sequential rule); a batch of 2, 0, 3, 1 took three graph
computations where 0, 1, 2, 3 takes one (a 4-sequence step of SmolLM2: 31 against 22 ms)."""
from __future__ import annotations

from types import SimpleNamespace

from runtime.backends.llama_cpp.adapters import LoraSet
from runtime.backends.llama_cpp.batch import TokenBatch
from runtime.backends.llama_cpp.batching import BatchLoop
from runtime.errors import BackendError


class RecordedBatch(TokenBatch):
    """A TokenBatch without llama.cpp: it records each entry's (sequence, token)."""

    def __init__(self, capacity: int):
        self.capacity, self.entries = capacity, []

    def __len__(self):
        return len(self.entries)

    def clear(self):
        self.entries = []

    def add(self, token, position, seq, logits):
        self.entries.append((seq, token))
        return len(self.entries) - 1


class Context:
    """A context of four sequences whose decode records the batch, then fails (so the step ends there)."""

    def __init__(self):
        self.n_batch, self.n_seq, self.batch = 16, 4, RecordedBatch(16)
        self.sequences = [[1, 2], [1, 2], [1, 2], [1, 2]]
        self.decoded: list[tuple[int, int]] = []

    def decode_batch(self, appended):
        self.decoded = list(self.batch.entries)
        raise BackendError("recorded")


class BaseOnly(LoraSet):
    """No adapter is ever put on the (fake) context."""

    def apply(self, context, adapter):
        assert adapter is None


def generation(pending: int | None = None, prompt: list[int] | None = None):
    tokens = prompt or []
    return SimpleNamespace(request=SimpleNamespace(adapter=None), pending=pending, tokens=tokens, prefilled=0,
                           prefilling=bool(tokens), stopped=lambda: False, end=lambda error=None: None)


def step(active: dict) -> list[tuple[int, int]]:
    context = Context()
    BatchLoop("m", lambda: (context, None), BaseOnly())._step(active, context)
    return context.decoded


def test_answering_sequences_go_into_the_batch_in_sequence_order():
    active = {seq: generation(pending=100 + seq) for seq in (2, 0, 3, 1)}  # admitted in that order
    assert step(active) == [(0, 100), (1, 101), (2, 102), (3, 103)]


def test_prompt_chunks_and_answers_go_in_sequence_order_the_answers_first_in_the_room():
    active = {3: generation(pending=103), 1: generation(prompt=[7, 8, 9]), 0: generation(pending=100),
              2: generation(prompt=[5] * 20)}
    # Room for 16: the two answers' tokens, then 3 of sequence 1's prompt and 11 of sequence 2's.
    assert step(active) == [(0, 100), (1, 7), (1, 8), (1, 9), *[(2, 5)] * 11, (3, 103)]


def test_the_room_for_prompts_goes_to_the_earliest_admitted_first():
    """The order of the entries is the sequences', but a long prompt admitted first is not held
    back by later ones that happen to take a lower sequence."""
    active = {3: generation(prompt=[5] * 20), 0: generation(prompt=[7] * 20)}
    assert step(active) == [(3, 5)] * 16
