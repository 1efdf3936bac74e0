"""One generation of the llama_cpp engine, run on its replica's worker thread.

The context's KV cache outlives each request: a prompt that starts with tokens the cache already
holds (the system prompt and the earlier turns of a conversation) decodes only the rest
(``GgufContext.reuse``), and ``Finished.cached_tokens`` says how many were reused.  The sampler
is new for every generation, so nothing of one answer's sampling carries over to the next.
"""
from __future__ import annotations

import codecs
import logging

from runtime.backends.base import Finished, GenerationRequest, TextDelta
from runtime.backends.llama_cpp.kv_store import KvStore
from runtime.backends.llama_cpp.native import GgufContext, GgufWeights
from runtime.backends.llama_cpp.sampling import SamplingOptions
from runtime.errors import ContextLengthExceeded
from runtime.inference.stop_sequences import StopWatch
from runtime.inputs.prompt_formats import RenderedPrompt

logger = logging.getLogger("llmpool.llama_cpp")


def run_generation(
    weights: GgufWeights, context: GgufContext, prompt: RenderedPrompt, request: GenerationRequest,
    options: SamplingOptions, emit, stopped, model_name: str, kv_store: KvStore | None = None,
) -> None:
    """Prefill what the cache lacks of ``prompt``, then sample until a stop, ``emit``-ting
    TextDelta events and one Finished; ``stopped()`` true ends it at the next token (a cancelled
    request: the cache then holds exactly the tokens decoded so far, which a later request may
    reuse); ``kv_store``: saved caches, one of which is restored when it holds more of the
    prompt than the context does."""
    tokens = weights.tokenize_prompt(prompt)
    if len(tokens) >= context.n_ctx:
        raise ContextLengthExceeded(
            f"the prompt is {len(tokens)} tokens but model {model_name} has a context of "
            f"{context.n_ctx} tokens (gguf_n_ctx), which must also leave room for the reply",
            param="input",
        )
    if kv_store is not None:
        try:
            kv_store.restore(context, tokens)
        except Exception:  # a saved cache that fails is lost, never the request: it prefills
            logger.exception("model %s: restoring a saved KV cache failed", model_name)
            context.clear()
    cached = context.reuse(tokens)
    for start in range(cached, len(tokens), context.n_batch):
        if stopped():
            return
        context.decode(tokens[start:start + context.n_batch])
    sampler = context.sampler(options)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    stop_filter = StopWatch(prompt.stop)
    position, produced, reason, hit_stop = len(tokens), 0, "length", False
    unsent = _Unsent(request.logprobs)  # tokens whose text is still held back
    try:
        while produced < request.max_output_tokens and not stopped():
            token = sampler.sample(context)
            produced += 1  # an end-of-generation token counts too: the model produced it
            if weights.is_end_of_generation(token):
                reason = "stop"
                break
            unsent.add(context, token)
            text, hit_stop = stop_filter.feed(decoder.decode(weights.piece(token)))
            if text:
                emit(unsent.delta(text))
            if hit_stop:
                reason = "stop"
                break
            if position >= context.n_ctx:
                break  # the context is full: the reply is cut, as with max_output_tokens
            context.decode([token])
            position += 1
    finally:
        sampler.close()
    if not hit_stop:
        text, hit_stop = stop_filter.feed(decoder.decode(b"", final=True))
        text += "" if hit_stop else stop_filter.flush()
        if text or unsent.logprobs:
            emit(unsent.delta(text))
    emit(Finished(input_tokens=len(tokens), output_tokens=produced, finish_reason=reason, cached_tokens=cached))


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

    def add(self, context: GgufContext, token: int) -> None:
        self.tokens += 1
        if self.top_logprobs is not None:
            self.logprobs.append(context.token_logprobs(token, self.top_logprobs))

    def delta(self, text: str) -> TextDelta:
        delta = TextDelta(text, self.tokens, self.logprobs if self.top_logprobs is not None else None)
        self.tokens, self.logprobs = 0, []
        return delta
