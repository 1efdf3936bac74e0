"""llama.cpp's native objects, through llama-cpp-python's C bindings (``llama_cpp.llama_cpp``).

The high-level ``Llama`` class builds the model and its context in one constructor and
frees them together; here the two stay apart:

* ``GgufWeights`` owns the ``llama_model`` (weights, vocabulary), loaded once;
* ``GgufContext`` owns one ``llama_context`` (KV cache, compute buffers) built on
  those weights from ``ContextSettings`` (n_ctx, batch, threads, flash attention,
  K/V cache types).  Changing those settings means closing the context and
  opening another on the same weights; the weights are not reloaded.

None of these objects is thread-safe: each engine uses them from its one worker thread.
llama.cpp's log goes to the ``llmpool.llama_cpp`` logger; the warnings and errors of a
failed native call are quoted in the ``EngineLoadError`` it raises.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from runtime.errors import BackendError
from runtime.pool.gguf_info import ggml_type
from runtime.backends.llama_cpp.sampling import Sampler, SamplingOptions
from runtime.inputs.prompt_formats import RenderedPrompt

logger = logging.getLogger("llmpool.llama_cpp")

FLASH_ATTN_TYPES = {"auto": -1, "off": 0, "on": 1}  # enum llama_flash_attn_type
POOLING_TYPES = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}  # enum llama_pooling_type
_GGML_LOG_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
_GGML_LOG_CONT = 5


class EngineLoadError(RuntimeError):
    """A replica could not be loaded; the message is the model's ``last_error``."""


def default_threads() -> int:
    """Half the CPUs this process may use (about the physical cores), at least one."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, cpus // 2)


# ---- the native library ------------------------------------------------------------------


class _NativeLog:
    """Routes llama.cpp's log into Python logging and keeps the warnings and errors of the
    current thread's native call, so a failed load can say why."""

    def __init__(self):
        self._local = threading.local()

    def callback(self, level: int, text: bytes, _user_data) -> None:
        message = text.decode("utf-8", errors="replace")
        lines = getattr(self._local, "lines", None)
        if level == _GGML_LOG_CONT:
            level = getattr(self._local, "last_level", 2)
            if lines and level >= 3:
                lines[-1] = (level, lines[-1][1] + message)
        else:
            self._local.last_level = level
            if lines is not None and level >= 3:
                lines.append((level, message))
        if message.strip():
            logger.log(_GGML_LOG_LEVELS.get(level, logging.DEBUG), "%s", message.rstrip())

    def capture(self) -> list[tuple[int, str]]:
        self._local.lines = []
        return self._local.lines

    def release(self) -> None:
        self._local.lines = None


_LOG = _NativeLog()
_NATIVE_LOCK = threading.Lock()
_native_module = None
_native_callback = None  # the ctypes callback must outlive every native call


def native():
    """llama-cpp-python's C bindings, initialised once (backend, log routing)."""
    global _native_module, _native_callback
    with _NATIVE_LOCK:
        if _native_module is None:
            import llama_cpp

            _native_callback = llama_cpp.llama_log_callback(_LOG.callback)
            llama_cpp.llama_log_set(_native_callback, ctypes.c_void_p(0))
            _pin_mmap_threshold()
            llama_cpp.llama_backend_init()
            _native_module = llama_cpp
    return _native_module


def llama_version() -> str:
    """llama-cpp-python's version: the llama.cpp build whose state files this process reads."""
    return getattr(native(), "__version__", "unknown")


def _native_errors(lines: list[tuple[int, str]]) -> str:
    """The last error lines of a failed native call (its warnings when it logged no error)."""
    errors = [text.strip() for level, text in lines if level >= 4 and text.strip()]
    problems = errors or [text.strip() for _, text in lines if text.strip()]
    return "; ".join(problems[-3:]) if problems else "no detail from llama.cpp"


_M_MMAP_THRESHOLD = -3  # mallopt parameter (glibc malloc.h)
_MMAP_THRESHOLD_BYTES = 1024 * 1024


@functools.lru_cache(maxsize=1)
def _libc():
    """The C library's symbols (``dlopen(NULL)``), or None where they cannot be reached."""
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def _pin_mmap_threshold() -> None:
    """Keep llama.cpp's large buffers in their own mappings, so unloading unmaps them.

    glibc raises its mmap threshold after a large block is freed; from then on buffers of a
    reloaded model come from the worker thread's malloc arena, and a non-main arena keeps its
    freed top in RSS even after ``malloc_trim``.  A fixed threshold turns that adjustment off.
    """
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)


def release_heap() -> None:
    """Hand freed heap back to the OS (glibc keeps it otherwise), so unload lowers RSS."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (by slices, compared in C: fast for 30k tokens)."""
    count = min(len(a), len(b))
    if a[:count] == b[:count]:
        return count
    low, high = 0, count  # a[:low] == b[:low]; a[:high] != b[:high]
    while high - low > 1:
        middle = (low + high) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle
    return low


# ---- weights and context -----------------------------------------------------------------


def _progress_callback(lib, on_progress):
    """llama.cpp's load progress callback calling ``on_progress(fraction)`` (None: none); an
    exception in it is logged, never raised into the native load, which goes on."""
    if on_progress is None:
        return None

    def callback(fraction, _user_data):
        try:
            on_progress(float(fraction))
        except Exception:
            logger.exception("the load progress callback failed")
        return True

    return lib.llama_progress_callback(callback)


class GgufWeights:
    """A loaded ``llama_model``: weights and vocabulary.  Not thread-safe; one owner thread."""

    def __init__(self, path: str, n_gpu_layers: int, on_progress=None, main_gpu: int = 0):
        lib = native()
        params = lib.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.main_gpu = main_gpu  # the placement's GPU (runtime.backends.llama_cpp.engine.main_gpu)
        progress = _progress_callback(lib, on_progress)  # referenced until the load returns
        if progress is not None:
            params.progress_callback = progress
        lines = _LOG.capture()
        try:
            model = lib.llama_model_load_from_file(path.encode("utf-8"), params)
        finally:
            _LOG.release()
        if not model:
            raise EngineLoadError(f"llama.cpp could not load {path}: {_native_errors(lines)}")
        self._lib = lib
        self.path = path
        self.model = model
        self.vocab = lib.llama_model_get_vocab(model)
        self.bos = lib.llama_vocab_bos(self.vocab)
        self.eos = lib.llama_vocab_eos(self.vocab)
        self.add_bos = bool(lib.llama_vocab_get_add_bos(self.vocab))
        self.n_vocab = lib.llama_vocab_n_tokens(self.vocab)
        self._piece = ctypes.create_string_buffer(256)

    def token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self._lib.llama_vocab_get_text(self.vocab, token).decode("utf-8", errors="replace")

    def tokenize(self, text: str, *, parse_special: bool, add_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 4
        buffer = (self._lib.llama_token * capacity)()
        count = self._lib.llama_tokenize(self.vocab, data, len(data), buffer, capacity, add_special, parse_special)
        if count < 0:  # too small: -count is the size it needs
            capacity = -count
            buffer = (self._lib.llama_token * capacity)()
            count = self._lib.llama_tokenize(self.vocab, data, len(data), buffer, capacity, add_special, parse_special)
        return list(buffer[:count])

    def tokenize_input(self, text: str) -> list[int]:
        """An embedding input as llama-server tokenizes one: plain text, with the BOS and EOS the
        vocabulary asks for (``add_special``)."""
        return self.tokenize(text, parse_special=False, add_special=True)

    @property
    def n_embd_out(self) -> int:
        """The size of the model's output embeddings (a pooled vector's length)."""
        return self._lib.llama_model_n_embd_out(self.model)

    def tokenize_prompt(self, prompt: RenderedPrompt) -> list[int]:
        """Markup parsed for special tokens, content as plain text; BOS added when the vocabulary
        wants one and the prompt did not bring it."""
        tokens: list[int] = []
        for text, markup in prompt.parts:
            tokens.extend(self.tokenize(text, parse_special=markup))
        if self.add_bos and self.bos >= 0 and (not tokens or tokens[0] != self.bos):
            tokens.insert(0, self.bos)
        return tokens

    def piece(self, token: int) -> bytes:
        size = self._lib.llama_token_to_piece(self.vocab, token, self._piece, len(self._piece), 0, False)
        if size < 0:
            self._piece = ctypes.create_string_buffer(-size)
            size = self._lib.llama_token_to_piece(self.vocab, token, self._piece, len(self._piece), 0, False)
        return self._piece.raw[:size]

    def is_end_of_generation(self, token: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self.vocab, token))

    def close(self) -> None:
        if self.model:
            self._lib.llama_model_free(self.model)
            self.model = None
            self.vocab = None


@dataclass(frozen=True)
class ContextSettings:
    """What a ``llama_context`` is built with, apart from the weights (``GgufWeights``), which it does not own."""

    n_ctx: int
    n_batch: int
    n_threads: int
    flash_attn: str  # "on" | "off" | "auto"
    type_k: str | None  # GGML type name; None: llama.cpp's default (f16)
    type_v: str | None
    # Embedding mode (runtime.inference.embedding): how a sequence's token embeddings pool into its vector
    # ("mean", "cls", "last"; "rank": a reranker's score, runtime.inference.rerank); None: a context that only generates.
    pooling: str | None = None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ContextSettings:
        return cls(
            n_ctx=config["gguf_n_ctx"],
            n_batch=config["gguf_n_batch"],
            n_threads=config["gguf_n_threads"] or default_threads(),
            flash_attn=config["gguf_flash_attn"],
            type_k=config["gguf_type_k"],
            type_v=config["gguf_type_v"],
        )

    def describe(self) -> str:
        return (
            f"n_ctx={self.n_ctx}, n_batch={self.n_batch}, flash_attn={self.flash_attn}, "
            f"type_k={self.type_k or 'f16'}, type_v={self.type_v or 'f16'}"
            + (f", embeddings pooled by {self.pooling}" if self.pooling else "")
        )


class GgufContext:
    """One ``llama_context`` over loaded weights: the KV cache and the compute buffers."""

    def __init__(self, weights: GgufWeights, settings: ContextSettings):
        lib = weights._lib
        params = lib.llama_context_default_params()
        params.n_ctx = settings.n_ctx
        params.n_batch = settings.n_batch
        params.n_ubatch = min(settings.n_batch, params.n_ubatch)
        params.n_seq_max = 1
        params.n_threads = settings.n_threads
        params.n_threads_batch = settings.n_threads
        params.flash_attn_type = FLASH_ATTN_TYPES[settings.flash_attn]
        if settings.type_k is not None:
            params.type_k = ggml_type(settings.type_k).value
        if settings.type_v is not None:
            params.type_v = ggml_type(settings.type_v).value
        params.no_perf = True
        if settings.pooling is not None:
            # llama-server's embedding mode: built with embeddings on (its buffers reserved for
            # them), switched on only while an input is embedded.  A sequence's pooled vector
            # comes from one micro-batch, so the whole input must fit in one: n_ubatch = n_batch.
            params.embeddings = True
            params.pooling_type = POOLING_TYPES[settings.pooling]
            params.n_ubatch = settings.n_batch
        lines = _LOG.capture()
        try:
            ctx = lib.llama_init_from_model(weights.model, params)
        finally:
            _LOG.release()
        if not ctx:
            raise EngineLoadError(
                f"llama.cpp rejected the context settings ({settings.describe()}): {_native_errors(lines)}"
            )
        self._lib = lib
        self.weights = weights
        self.settings = settings
        self.ctx = ctx
        self.n_ctx = lib.llama_n_ctx(ctx)
        self.n_batch = lib.llama_n_batch(ctx)
        self.n_ubatch = lib.llama_n_ubatch(ctx)
        self.n_swa = lib.llama_model_n_swa(weights.model)
        # The tokens sequence 0 of the KV cache holds, position by position: what the next
        # request can reuse (``reuse``).  Every change of the cache goes through clear/decode/reuse.
        self.tokens: list[int] = []
        if settings.pooling is not None:
            lib.llama_set_embeddings(ctx, False)  # generation as in any context, until embed

    def clear(self) -> None:
        memory = self._lib.llama_get_memory(self.ctx)
        if memory:
            self._lib.llama_memory_clear(memory, True)
        self.tokens = []

    def decode(self, tokens: list[int]) -> None:
        """Append ``tokens`` to the sequence (positions continue from the cache).  A failed
        decode clears the cache: what it left there is not known, so nothing of it is reused."""
        array = (self._lib.llama_token * len(tokens))(*tokens)
        status = self._lib.llama_decode(self.ctx, self._lib.llama_batch_get_one(array, len(tokens)))
        if status != 0:
            self.clear()
            raise BackendError(f"llama.cpp could not decode {len(tokens)} tokens (llama_decode returned {status})")
        self.tokens.extend(tokens)

    def reuse(self, prompt: list[int]) -> int:
        """Keep the longest prefix of ``prompt`` that the cache already holds and drop the rest
        of the sequence; returns how many tokens were kept (the caller decodes the others).

        At least the prompt's last token is always left to decode, so the next sample reads
        logits computed for this prompt.  A sliding-window model (Gemma 3) keeps only the last
        ``n_swa`` positions of its windowed layers: a prefix whose window was already dropped
        from the cache cannot be continued, and the whole prompt is decoded again, as
        llama-server does when its cache lacks that data."""
        kept = min(common_prefix(prompt, self.tokens), len(prompt) - 1)
        lib = self._lib
        memory = lib.llama_get_memory(self.ctx)
        if kept > 0 and self.n_swa > 0 and lib.llama_memory_seq_pos_min(memory, 0) > max(0, kept - self.n_swa):
            kept = 0
        if kept == 0:
            self.clear()
            return 0
        if kept < len(self.tokens):
            if not lib.llama_memory_seq_rm(memory, 0, kept, -1):  # a memory that cannot cut a sequence
                self.clear()
                return 0
            del self.tokens[kept:]
        return kept

    def embed(self, tokens: list[int]) -> list[float]:
        """The pooled embedding of ``tokens`` (at most ``n_ubatch``), as llama.cpp computes it:
        the cache cleared, the sequence decoded with embeddings on, every token an output.  With
        rank pooling it is the classification head's output: one value per class (``n_cls_out``)."""
        self.clear()
        self._lib.llama_set_embeddings(self.ctx, True)
        try:
            self._decode_outputs(tokens)
            pointer = self._lib.llama_get_embeddings_seq(self.ctx, 0)
            if not pointer:
                raise BackendError("llama.cpp computed no sequence embedding (the context pools nothing)")
            ranked = self.settings.pooling == "rank"
            return pointer[: self._lib.llama_model_n_cls_out(self.weights.model) if ranked else self.weights.n_embd_out]
        finally:
            self._lib.llama_set_embeddings(self.ctx, False)
            self.clear()

    def _decode_outputs(self, tokens: list[int]) -> None:
        """Decode ``tokens`` as sequence 0 from position 0, every token marked as an output (an
        embedding needs them all; llama.cpp warns and overrides otherwise)."""
        lib = self._lib
        batch = lib.llama_batch_init(len(tokens), 0, 1)
        try:
            batch.n_tokens = len(tokens)
            for index, token in enumerate(tokens):
                batch.token[index] = token
                batch.pos[index] = index
                batch.n_seq_id[index] = 1
                batch.seq_id[index][0] = 0
                batch.logits[index] = True
            status = lib.llama_decode(self.ctx, batch)
        finally:
            lib.llama_batch_free(batch)
        if status != 0:
            raise BackendError(f"llama.cpp could not decode {len(tokens)} tokens (llama_decode returned {status})")

    def sampler(self, options: SamplingOptions) -> Sampler:
        return Sampler(self._lib, options, self.weights.n_vocab, self.n_ctx, self.weights.vocab)

    def token_logprobs(self, token: int, top: int) -> dict:
        """The chat completions logprobs entry of ``token``, just sampled from the last decode's
        logits: its log-probability under the model (llama-cpp-python's ``logits_to_logprobs``,
        as its ``create_completion`` reports them) and the ``top`` most likely tokens'."""
        import numpy

        logits = numpy.ctypeslib.as_array(self._lib.llama_get_logits_ith(self.ctx, -1), shape=(self.weights.n_vocab,))
        logprobs = self._lib.Llama.logits_to_logprobs(logits)
        entry = self._entry(token, logprobs)
        best = numpy.argpartition(-logprobs, top - 1)[:top] if top else ()
        ranked = sorted(best, key=lambda candidate: -logprobs[candidate])
        return {**entry, "top_logprobs": [self._entry(int(candidate), logprobs) for candidate in ranked]}

    def _entry(self, token: int, logprobs) -> dict:
        piece = self.weights.piece(token)
        return {"token": piece.decode("utf-8", errors="replace"), "logprob": float(logprobs[token]), "bytes": list(piece)}

    def close(self) -> None:
        if self.ctx:
            self._lib.llama_free(self.ctx)
            self.ctx = None
