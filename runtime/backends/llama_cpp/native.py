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
from runtime.gguf_info import ggml_type
from runtime.prompt_formats import RenderedPrompt

logger = logging.getLogger("llmpool.llama_cpp")

FLASH_ATTN_TYPES = {"auto": -1, "off": 0, "on": 1}  # enum llama_flash_attn_type
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


# ---- weights and context -----------------------------------------------------------------


class GgufWeights:
    """A loaded ``llama_model``: weights and vocabulary.  Not thread-safe; one owner thread."""

    def __init__(self, path: str, n_gpu_layers: int):
        lib = native()
        params = lib.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
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
        self._piece = ctypes.create_string_buffer(256)

    def token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self._lib.llama_vocab_get_text(self.vocab, token).decode("utf-8", errors="replace")

    def tokenize(self, text: str, *, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 2
        buffer = (self._lib.llama_token * capacity)()
        count = self._lib.llama_tokenize(self.vocab, data, len(data), buffer, capacity, False, parse_special)
        if count < 0:
            capacity = -count
            buffer = (self._lib.llama_token * capacity)()
            count = self._lib.llama_tokenize(self.vocab, data, len(data), buffer, capacity, False, parse_special)
        return list(buffer[:count])

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

    def clear(self) -> None:
        memory = self._lib.llama_get_memory(self.ctx)
        if memory:
            self._lib.llama_memory_clear(memory, True)

    def decode(self, tokens: list[int]) -> None:
        """Append ``tokens`` to the sequence (positions continue from the cache)."""
        array = (self._lib.llama_token * len(tokens))(*tokens)
        status = self._lib.llama_decode(self.ctx, self._lib.llama_batch_get_one(array, len(tokens)))
        if status != 0:
            raise BackendError(f"llama.cpp could not decode {len(tokens)} tokens (llama_decode returned {status})")

    def sampler(self, temperature: float, top_p: float) -> _Sampler:
        return _Sampler(self._lib, temperature, top_p)

    def close(self) -> None:
        if self.ctx:
            self._lib.llama_free(self.ctx)
            self.ctx = None


class _Sampler:
    """A llama.cpp sampler chain: greedy at temperature 0, else top-p, temperature, random draw."""

    def __init__(self, lib, temperature: float, top_p: float):
        self._lib = lib
        self.chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        if temperature <= 0:
            lib.llama_sampler_chain_add(self.chain, lib.llama_sampler_init_greedy())
        else:
            if top_p < 1.0:
                lib.llama_sampler_chain_add(self.chain, lib.llama_sampler_init_top_p(top_p, 1))
            lib.llama_sampler_chain_add(self.chain, lib.llama_sampler_init_temp(temperature))
            lib.llama_sampler_chain_add(self.chain, lib.llama_sampler_init_dist(lib.LLAMA_DEFAULT_SEED))

    def sample(self, context: GgufContext) -> int:
        return self._lib.llama_sampler_sample(self.chain, context.ctx, -1)

    def close(self) -> None:
        if self.chain:
            self._lib.llama_sampler_free(self.chain)
            self.chain = None
