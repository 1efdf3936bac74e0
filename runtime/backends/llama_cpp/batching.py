"""Continuous batching: the generations of one llama_cpp replica share its context, one
sequence (slot) each, as llama-server's ``update_slots`` runs its slots.

Each step builds one ``llama_batch``: first the token each answering sequence sampled last,
then, in the room left of ``n_batch``, the next chunk of each prompt still being prefilled, so
a long prompt goes in between decode steps and never stalls the answers already running.  One
``llama_decode`` computes them all; every sequence whose logits came out samples its next token
with its own sampler.  With speculative decoding an answering sequence also puts the draft
tokens of its pending one in the batch, and keeps those its sampler agrees with (``speculative``).  A new request waits for a free sequence (the runtime's scheduler lets at
most ``target_inflight`` in), and takes the free one whose cached tokens share the longest
prefix with its prompt, when that prefix is more than a tenth of the prompt (llama-server's
``--slot-prompt-similarity`` 0.1); otherwise, and among equals, the least recently used one.
Sequences with different LoRA adapters are not decoded in one batch (llama-server's rule): each
step decodes the sequences of one adapter, the adapters taking turns (``adapters.LoraSet``).

Everything here runs on the replica's worker thread, the one caller of its native objects: the
loop runs while any generation is active or waiting, and ends when none is; ``submit`` starts
it again.  Load, sleep, reconfigure and unload queue behind it on the same thread.  After each
admission and each step it calls ``flush``, which hands what the generations emitted meanwhile
to their readers at once.
"""
from __future__ import annotations

import itertools
import logging
import threading
from collections import deque

from runtime.backends.llama_cpp.adapters import LoraSet
from runtime.backends.llama_cpp.generation import Generation
from runtime.backends.llama_cpp.native import common_prefix
from runtime.backends.llama_cpp.speculative import Speculation, SpeculationSettings, verify
from runtime.errors import BackendError, LLMPoolError

logger = logging.getLogger("llmpool.llama_cpp")

SLOT_PROMPT_SIMILARITY = 0.1  # llama-server's default: a shorter shared prefix is not worth a slot


def choose_sequence(sequences: list[list[int]], free: list[int], prompt: list[int], last_used: dict[int, int]) -> int:
    """The free sequence for ``prompt``: the one whose tokens share the longest prefix with it,
    when that prefix is more than ``SLOT_PROMPT_SIMILARITY`` of the prompt; otherwise, and among
    equals, the least recently used (``last_used``: sequence -> when it was last released)."""
    def score(seq: int) -> tuple[int, int]:
        shared = common_prefix(sequences[seq], prompt)
        return (shared if shared > SLOT_PROMPT_SIMILARITY * len(prompt) else 0, -last_used.get(seq, 0))

    return max(free, key=score)


class BatchLoop:
    """The waiting and active generations of one replica.  ``state()`` gives the replica's
    current (context, kv_store); a context of None (asleep, unloaded) ends what waits with an error."""

    def __init__(self, model_name: str, state, adapters: LoraSet, speculation: Speculation | None = None,
                 flush=lambda: None):
        self.model_name = model_name
        self._state = state
        self._adapters = adapters  # one adapter per decode (runtime.backends.llama_cpp.adapters)
        self._speculation = speculation or Speculation(SpeculationSettings(None))
        self._flush = flush
        self._waiting: deque[Generation] = deque()
        self._lock = threading.Lock()
        self._running = False
        self._clock = itertools.count(1)
        self._last_used: dict[int, int] = {}  # sequence -> when a generation last ended on it

    def submit(self, generation: Generation, executor) -> None:
        """Queue ``generation``; start the loop on ``executor`` (the worker) unless it runs.
        Raises RuntimeError when the executor is shut down (the replica unloaded)."""
        with self._lock:
            self._waiting.append(generation)
            if self._running:
                return
            self._running = True
        try:
            executor.submit(self._run)
        except RuntimeError:
            with self._lock:
                self._running = False
                self._waiting.remove(generation)
            raise

    def recency(self) -> list[int]:
        """The sequences from the least to the most recently used (never-used ones first)."""
        with self._lock:
            last_used = dict(self._last_used)
        context, _ = self._state()
        return sorted(range(context.n_seq if context else 0), key=lambda seq: last_used.get(seq, 0))

    # -- the loop ------------------------------------------------------------------------
    def _run(self) -> None:
        active: dict[int, Generation] = {}
        try:
            while True:
                context, kv_store = self._state()
                self._admit(active, context, kv_store)
                self._flush()
                if not active:
                    with self._lock:
                        if not self._waiting:
                            self._running = False
                            return
                    continue
                self._step(active, context)
                self._flush()
        except BaseException as exc:  # a native failure ends this batch's generations, not the worker
            logger.exception("model %s: the batch loop failed", self.model_name)
            error = exc if isinstance(exc, LLMPoolError) else BackendError(f"llama.cpp generation failed: {exc}")
            with self._lock:
                waiting, self._waiting = list(self._waiting), deque()
                self._running = False
            for generation in [*active.values(), *waiting]:
                generation.end(error)
            self._flush()

    def _admit(self, active: dict[int, Generation], context, kv_store) -> None:
        """Give each waiting generation a free sequence, while there is one."""
        while True:
            with self._lock:
                if not self._waiting or (context is not None and len(active) >= context.n_seq):
                    return
                generation = self._waiting.popleft()
            if generation.stopped():
                generation.end(self._stopped())
                continue
            if context is None:
                generation.end(BackendError(f"model {self.model_name} was unloaded before the request ran"))
                continue
            try:
                tokens = generation.tokenize(context.n_ctx)
                adapter = generation.request.adapter
                seq = choose_sequence(self._adapters.visible(context, adapter),
                                      [s for s in range(context.n_seq) if s not in active], tokens, self._last_used)
                self._adapters.take(context, seq, adapter)
                generation.start(context, seq, kv_store if adapter is None else None)
                self._speculation.start(generation)
            except Exception as exc:  # this request fails, not the others
                if not isinstance(exc, LLMPoolError):
                    logger.exception("model %s: a generation could not start", self.model_name)
                    exc = BackendError(f"llama.cpp generation failed: {exc}")
                generation.end(exc)
                continue
            active[seq] = generation

    def _step(self, active: dict[int, Generation], context) -> None:
        """One batch: drop what was stopped, decode a token per answer and prompt chunks in
        the room left, then sample every sequence that has logits."""
        for seq, generation in list(active.items()):
            if generation.stopped():
                self._release(active, seq).end(self._stopped())
        if not active:
            return
        adapter = self._adapters.turn([generation.request.adapter for generation in active.values()])
        members = {seq: g for seq, g in active.items() if g.request.adapter == adapter}  # in admission order
        batch = context.batch
        batch.clear()
        appended: dict[int, list[int]] = {}
        outputs: dict[int, list[int]] = {}  # sequence -> the batch entries whose logits it samples
        drafts: dict[int, list[int]] = {}  # sequence -> the draft tokens after its pending one
        answering = {seq: generation for seq, generation in members.items() if generation.pending is not None}
        if self._speculation.enabled and answering:
            drafts = self._speculation.drafts(context, answering, max(0, context.n_batch - len(members)) // len(members))
        # The answers' tokens first, then prompt chunks in the room left, the earliest admitted
        # prompt first.
        room = context.n_batch - sum(1 + len(drafts.get(seq, ())) for seq in answering)
        chunks: dict[int, list[int]] = {}
        for seq, generation in members.items():
            if room <= 0:
                break
            if generation.prefilling:
                chunks[seq] = generation.tokens[generation.prefilled:generation.prefilled + room]
                room -= len(chunks[seq])
        # Added in sequence order: with a KV cache per sequence (not unified), llama.cpp puts
        # sequences in one micro-batch only as a run of consecutive ids (split_equal's sequential
        # rule), so a batch of 2, 0, 3, 1 took three graph computations where 0, 1, 2, 3 takes one
        # (a 4-sequence step: 31 against 22 ms).  llama-server walks its slots in order too.  A gap
        # (0, 2, 3 with 1 free) still makes two.
        for seq in sorted(members):
            generation = members[seq]
            if seq in answering:
                appended[seq] = [generation.pending, *drafts.get(seq, ())]
                start = len(context.sequences[seq])
                outputs[seq] = [batch.add(token, start + offset, seq, True) for offset, token in enumerate(appended[seq])]
                generation.pending = None
            elif seq in chunks:
                chunk = appended[seq] = chunks[seq]
                last = generation.prefilled + len(chunk) == len(generation.tokens)
                index = batch.add_run(chunk, generation.prefilled, seq, logits_last=last)
                if last:
                    outputs[seq] = [index]
                generation.prefilled += len(chunk)
        try:
            self._adapters.apply(context, adapter)
            context.decode_batch(appended)
        except LLMPoolError as exc:
            for seq in appended:
                self._release(active, seq).end(exc)
            return
        for seq, indices in outputs.items():
            generation = active[seq]
            if verify(generation, context, seq, indices, drafts.get(seq, [])):
                self._release(active, seq)
                generation.finish()

    def _stopped(self) -> BackendError:
        """What a stopped generation's stream ends with: seen only after an unload, as a
        cancelled request has no reader left."""
        return BackendError(f"model {self.model_name} stopped the request (cancelled, or the model unloaded)")

    def _release(self, active: dict[int, Generation], seq: int) -> Generation:
        with self._lock:
            self._last_used[seq] = next(self._clock)
        return active.pop(seq)
