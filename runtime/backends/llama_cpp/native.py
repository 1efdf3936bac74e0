"""llama.cpp's native objects, through llama-cpp-python's C bindings (``llama_cpp.llama_cpp``).

The high-level ``Llama`` class builds the model and its context in one constructor and
frees them together; here the two stay apart:

* ``GgufWeights`` owns the ``llama_model`` (weights, vocabulary), loaded once;
* ``GgufContext`` owns one ``llama_context`` (KV cache, compute buffers) built on
  those weights from ``ContextSettings`` (n_ctx, batch, threads, flash attention,
  K/V cache types, sequences).  Changing those settings means closing the context and
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
from runtime.backends.llama_cpp.batch import TokenBatch
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
    # The sequences (slots) the context serves at once (target_inflight), each with a KV cache
    # of its own of ``n_ctx`` cells: llama.cpp's non-unified cache, llama-server's ``-np N`` with
    # ``-c N*n_ctx`` and ``--kv-unified`` off.
    n_seq: int = 1

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ContextSettings:
        return cls(
            n_ctx=config["gguf_n_ctx"],
            n_batch=config["gguf_n_batch"],
            n_threads=config["gguf_n_threads"] or default_threads(),
            flash_attn=config["gguf_flash_attn"],
            type_k=config["gguf_type_k"],
            type_v=config["gguf_type_v"],
            n_seq=config.get("target_inflight") or 1,
        )

    def describe(self) -> str:
        return (
            f"n_ctx={self.n_ctx}, n_seq={self.n_seq}, n_batch={self.n_batch}, flash_attn={self.flash_attn}, "
            f"type_k={self.type_k or 'f16'}, type_v={self.type_v or 'f16'}"
            + (f", embeddings pooled by {self.pooling}" if self.pooling else "")
        )


class GgufContext:
    """One ``llama_context`` over loaded weights: the KV cache of ``n_seq`` sequences and the
    compute buffers.  Sequence ``seq`` holds ``sequences[seq]``, position by position: what the
    next request on it can reuse (``reuse``); every change of the cache goes through
    clear/decode/decode_batch/reuse (or the KV store's restore, which sets the tokens it put)."""

    def __init__(self, weights: GgufWeights, settings: ContextSettings):
        lib = weights._lib
        params = lib.llama_context_default_params()
        params.n_ctx = settings.n_ctx * settings.n_seq
        params.n_batch = settings.n_batch
        params.n_ubatch = min(settings.n_batch, params.n_ubatch)
        params.n_seq_max = settings.n_seq
        params.kv_unified = False
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
        self.n_ctx = lib.llama_n_ctx_seq(ctx)  # per sequence
        self.n_seq = lib.llama_n_seq_max(ctx)
        self.n_batch = lib.llama_n_batch(ctx)
        self.n_ubatch = lib.llama_n_ubatch(ctx)
        self.n_swa = lib.llama_model_n_swa(weights.model)
        self.sequences: list[list[int]] = [[] for _ in range(self.n_seq)]
        self.batch = TokenBatch(lib, self.n_batch)
        if settings.pooling is not None:
            lib.llama_set_embeddings(ctx, False)  # generation as in any context, until embed

    @property
    def tokens(self) -> list[int]:
        """Sequence 0's tokens: the whole cache of a one-sequence context."""
        return self.sequences[0]

    def clear(self, seq: int | None = None) -> None:
        """Empty sequence ``seq`` of the cache (None: every sequence)."""
        memory = self._lib.llama_get_memory(self.ctx)
        if memory:
            if seq is None:
                self._lib.llama_memory_clear(memory, True)
            else:
                self._lib.llama_memory_seq_rm(memory, seq, -1, -1)
        for index in range(self.n_seq) if seq is None else (seq,):
            self.sequences[index] = []

    def decode(self, tokens: list[int], seq: int = 0) -> None:
        """Append ``tokens`` (at most ``n_batch``) to sequence ``seq``, positions continuing from
        what it holds, the last one's logits wanted."""
        self.batch.clear()
        self.batch.add_run(tokens, len(self.sequences[seq]), seq, logits_last=True)
        self.decode_batch({seq: tokens})

    def decode_batch(self, appended: dict[int, list[int]]) -> None:
        """Decode ``self.batch``, which appends ``appended[seq]`` to each sequence.  A failed
        decode clears those sequences: what it left there is not known, so nothing of it is reused."""
        try:
            self.batch.decode(self.ctx)
        except BackendError:
            for seq in appended:
                self.clear(seq)
            raise
        for seq, tokens in appended.items():
            self.sequences[seq].extend(tokens)

    def reuse(self, prompt: list[int], seq: int = 0) -> int:
        """Keep the longest prefix of ``prompt`` that sequence ``seq`` already holds and drop the
        rest of it; returns how many tokens were kept (the caller decodes the others).

        At least the prompt's last token is always left to decode, so the next sample reads
        logits computed for this prompt.  A sliding-window model (Gemma 3) keeps only the last
        ``n_swa`` positions of its windowed layers: a prefix whose window was already dropped
        from the cache cannot be continued, and the whole prompt is decoded again, as
        llama-server does when its cache lacks that data."""
        held = self.sequences[seq]
        kept = min(common_prefix(prompt, held), len(prompt) - 1)
        lib = self._lib
        memory = lib.llama_get_memory(self.ctx)
        if kept > 0 and self.n_swa > 0 and lib.llama_memory_seq_pos_min(memory, seq) > max(0, kept - self.n_swa):
            kept = 0
        if kept == 0:
            self.clear(seq)
            return 0
        if kept < len(held):
            if not lib.llama_memory_seq_rm(memory, seq, kept, -1):  # a memory that cannot cut a sequence
                self.clear(seq)
                return 0
            del held[kept:]
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
        batch = TokenBatch(self._lib, len(tokens))
        try:
            for index, token in enumerate(tokens):
                batch.add(token, index, 0, True)
            batch.decode(self.ctx)
        finally:
            batch.close()

    def sampler(self, options: SamplingOptions) -> Sampler:
        return Sampler(self._lib, options, self.weights.n_vocab, self.n_ctx, self.weights.vocab)

    def close(self) -> None:
        if self.ctx:
            self.batch.close()
            self._lib.llama_free(self.ctx)
            self.ctx = None
