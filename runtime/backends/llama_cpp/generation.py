"""One generation of the llama_cpp engine: one request's answer on one sequence of its
replica's context, driven step by step by the batch loop (``batching.BatchLoop``) on the
replica's worker thread.

The context's KV cache outlives each request: a prompt that starts with tokens its sequence
already holds (the system prompt and the earlier turns of a conversation) decodes only the rest
(``GgufContext.reuse``), and ``Finished.cached_tokens`` says how many were reused.  The sampler
is new for every generation, so nothing of one answer's sampling carries over to the next.

A request that does not stream is read when it ends, so its text need not cross to the event
loop (and, in an engine process, to the runtime) token by token: after its first delta, which
marks when output began, its deltas are held and handed over together, at most
``HOLD_SECONDS`` apart and all of them at its end, as the same events in the same order.  A
request with stop sequences is not held: the runtime watches for them, and the sooner it sees
one the fewer tokens are decoded past it.
"""
from __future__ import annotations

import codecs
import logging
import time

from runtime.backends.base import Finished, GenerationRequest, TextDelta
from runtime.backends.llama_cpp.kv_store import KvStore
from runtime.backends.llama_cpp.native import GgufContext, GgufWeights
from runtime.backends.llama_cpp.sampling import Sampler, SamplingOptions, token_logprobs
from runtime.errors import ContextLengthExceeded
from runtime.backends.shared.in_process import DONE, Failure
from runtime.inference.stop_sequences import StopWatch
from runtime.inputs.prompt_formats import RenderedPrompt

logger = logging.getLogger("llmpool.llama_cpp")

HOLD_SECONDS = 0.25  # how long the deltas of a request that does not stream may wait here


class Generation:
    """One request's answer: its prompt tokens, where the prefill stands, its sampler and the
    text it has sent.  ``emit`` receives TextDelta events, one Finished (or a Failure) and
    ``DONE``; ``stopped()`` true ends it before its next step (a cancelled request, an unload:
    its sequence then holds exactly the tokens decoded so far, which a later request may reuse)."""

    def __init__(self, weights: GgufWeights, prompt: RenderedPrompt, request: GenerationRequest,
                 options: SamplingOptions, emit, stopped, model_name: str):
        self.weights = weights
        self.prompt = prompt
        self.request = request
        self.options = options
        self.emit = emit
        self.stopped = stopped
        self.model_name = model_name
        self.tokens: list[int] = []  # the prompt's, set by start
        self.seq = -1
        self.prefilled = 0  # how many prompt tokens the sequence holds
        self.cached = 0  # of which were reused, not decoded
        self.pending: int | None = None  # the sampled token the next step decodes
        self.produced = 0
        self.drafter = None  # speculative decoding's state for this answer (speculative.Speculation)
        self.drafted = self.accepted_drafts = 0  # draft tokens verified, and of those accepted
        self.reason = "length"
        self._sampler: Sampler | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop_filter = StopWatch(prompt.stop)
        self._hit_stop = False
        self._unsent = _Unsent(request.logprobs)  # tokens whose text is still held back
        self._holds = not request.stream and not request.stop  # the module docstring
        self._held: list[TextDelta] = []
        self._handed_at: float | None = None  # when deltas were last handed over
        self._ended = False

    def tokenize(self, n_ctx: int) -> list[int]:
        """The prompt's tokens; raises ContextLengthExceeded when a sequence of ``n_ctx`` cannot hold them."""
        self.tokens = self.weights.tokenize_prompt(self.prompt)
        if len(self.tokens) >= n_ctx:
            raise ContextLengthExceeded(
                f"the prompt is {len(self.tokens)} tokens but model {self.model_name} has a context of "
                f"{n_ctx} tokens (gguf_n_ctx), which must also leave room for the reply",
                param="input",
            )
        return self.tokens

    def start(self, context: GgufContext, seq: int, kv_store: KvStore | None) -> None:
        """Take sequence ``seq``: restore a saved cache when it holds more of the prompt than the
        sequence does, keep what the sequence holds of the prompt, and build the sampler."""
        self.seq = seq
        if kv_store is not None:
            try:
                kv_store.restore(context, seq, self.tokens)
            except Exception:  # a saved cache that fails is lost, never the request: it prefills
                logger.exception("model %s: restoring a saved KV cache failed", self.model_name)
                context.clear(seq)
        self.cached = self.prefilled = context.reuse(self.tokens, seq)
        self._sampler = context.sampler(self.options)

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.tokens)

    def sample(self, context: GgufContext, index: int) -> int:
        """The target's next token from batch entry ``index`` (the sampler's state moves on with it)."""
        return self._sampler.sample(context, index)

    def take(self, context: GgufContext, token: int, index: int, held: int) -> bool:
        """Count ``token`` (sampled from batch entry ``index``) and send its text; True when the
        answer is over: end of generation, a stop sequence, max_output_tokens, or a full sequence
        (``held``: the tokens the sequence holds before this one)."""
        self.produced += 1  # an end-of-generation token counts too: the model produced it
        if self.weights.is_end_of_generation(token):
            self.reason = "stop"
            return True
        self._unsent.add(context, token, index)
        text, self._hit_stop = self._stop_filter.feed(self._decoder.decode(self.weights.piece(token)))
        if text:
            self._send(self._unsent.delta(text))
        if self._hit_stop:
            self.reason = "stop"
            return True
        return self.produced >= self.request.max_output_tokens or held >= context.n_ctx  # a full sequence cuts it

    def finish(self) -> None:
        """Send the text still held back and the Finished event, then end."""
        if not self._hit_stop:
            text, hit_stop = self._stop_filter.feed(self._decoder.decode(b"", final=True))
            text += "" if hit_stop else self._stop_filter.flush()
            if text or self._unsent.logprobs:
                self._held.append(self._unsent.delta(text))
        self._hand_over()
        drafting = self.drafter is not None
        self.emit(Finished(input_tokens=len(self.tokens), output_tokens=self.produced, finish_reason=self.reason,
                           cached_tokens=self.cached, draft_tokens=self.drafted if drafting else None,
                           accepted_tokens=self.accepted_drafts if drafting else None))
        self.end()

    def end(self, error: BaseException | None = None) -> None:
        """Free the sampler and close the stream (with ``error`` as its last event); once."""
        if self._ended:
            return
        self._ended = True
        if self._sampler is not None:
            self._sampler.close()
        self._hand_over()
        if error is not None:
            self.emit(Failure(error))
        self.emit(DONE)

    def _send(self, delta: TextDelta) -> None:
        """Emit ``delta``, or hold it (the module docstring)."""
        now = time.monotonic()
        if self._holds and self._handed_at is not None and now - self._handed_at < HOLD_SECONDS:
            self._held.append(delta)
            return
        self._held.append(delta)
        self._hand_over()
        self._handed_at = now

    def _hand_over(self) -> None:
        for delta in self._held:
            self.emit(delta)
        self._held = []


def sampling_options(request: GenerationRequest, grammar: str | None = None) -> SamplingOptions:
    return SamplingOptions(
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
        presence_penalty=request.presence_penalty or 0.0,
        frequency_penalty=request.frequency_penalty or 0.0,
        top_k=request.top_k or 0,
        repeat_penalty=1.0 if request.repeat_penalty is None else request.repeat_penalty,
        grammar=grammar,
    )


class _Unsent:
    """The tokens sampled since the last delta (and their logprobs entries when asked for)."""

    def __init__(self, top_logprobs: int | None):
        self.top_logprobs = top_logprobs
        self.tokens = 0
        self.logprobs: list[dict] = []

    def add(self, context: GgufContext, token: int, index: int) -> None:
        self.tokens += 1
        if self.top_logprobs is not None:
            self.logprobs.append(token_logprobs(context, token, self.top_logprobs, index))

    def delta(self, text: str) -> TextDelta:
        delta = TextDelta(text, self.tokens, self.logprobs if self.top_logprobs is not None else None)
        self.tokens, self.logprobs = 0, []
        return delta
