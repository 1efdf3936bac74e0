"""The llama_cpp engine: one replica of a GGUF model inside the runtime process.

The native objects (weights, context, sampler) are in ``native.py``.  Each
engine has one worker thread: load, the batch loop and unload run on it in order,
so native calls of a replica never overlap and the event loop never blocks.  Up to
``target_inflight`` generations share the context, one sequence each, decoded together
(``batching.BatchLoop``: continuous batching).  Tokens travel from the worker to the
request's async iterator through an ``asyncio.Queue``, those of all the sequences of one
batch step handed to the event loop at once (``StepDelivery``); closing the iterator (request
cancelled) or unloading sets a flag the loop checks before every step.

Tools (``request.tools``, tool_choice not "none") go into the prompt through the chat template
(``render_prompt``); the runtime reads the calls out of the answer in ``tool_call_format``
(the definition's, or the template's when "auto").  With tool_choice "required" or a named
function the answer is constrained by a grammar built from ``constrained_schema`` (the call
object(s) with each tool's parameters as their JSON schema), so it is a call whose arguments
parse; it is then read as format ``json``.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from runtime.backends.base import GenerationRequest
from runtime.backends.llama_cpp.adapters import LoraSet
from runtime.backends.llama_cpp.batching import BatchLoop
from runtime.backends.llama_cpp.draft_model import DraftModel
from runtime.backends.llama_cpp.generation import Generation, sampling_options
from runtime.backends.llama_cpp.kv_store import KvStore
from runtime.backends.llama_cpp.native import (
    ContextSettings,
    EngineLoadError,
    GgufContext,
    GgufWeights,
    llama_version,
    release_heap,
)
from runtime.backends.llama_cpp.rerank import PairLayout, context_pooling, score_pairs
from runtime.backends.llama_cpp.sampling import grammar_of_schema
from runtime.backends.llama_cpp.speculative import Speculation, SpeculationSettings
from runtime.inputs.chat_templates import TemplateRenderError, UnsafeTemplate, render_chat_template
from runtime.backends.shared.in_process import StepDelivery, drain
from runtime.backends.shared.vectors import normalized
from runtime.errors import (
    BackendError,
    ContextLengthExceeded,
    InsufficientMemory,
    InvalidLoadRequest,
    InvalidRequest,
    LLMPoolError,
)
from runtime.pool.gguf_info import GgufError, read_gguf_info
from runtime.pool.memory import OOM_WORDS
from runtime.model.load_progress import STAGE_CREATING_CONTEXT, STAGE_LOADING_WEIGHTS, ThreadedFraction
from runtime.pool.model_files import ModelFileError, resolve_model_file
from runtime.inputs.prompt_formats import (
    GGUF_TEMPLATE,
    GgufChatTemplate,
    RenderedPrompt,
    conversation_turns,
    render_prompt,
    resolve_thinking,
    tool_call_format,
)
from runtime.inference.tool_calls import choice_kind, constrained_schema, format_for

logger = logging.getLogger("llmpool.llama_cpp")


# ---- the engine --------------------------------------------------------------------------


class LlamaCppEngine:
    """One replica.  ``load``/``unload``/``generate`` are called on the event loop; the native
    work runs on this replica's worker thread."""

    def __init__(self, model_name: str, config: dict[str, Any], replica_index: int, context: dict):
        self.model_name = model_name
        self.config = config
        self.replica_index = replica_index
        self.base_dir = context.get("base_dir", ".")
        self._progress_context = context  # its on_load_progress hears the load's stages
        self._progress: ThreadedFraction | None = None
        self.prompt_format = config.get("prompt_format") or GGUF_TEMPLATE
        self.weights: GgufWeights | None = None
        self.context: GgufContext | None = None
        self.gguf_template: GgufChatTemplate | None = None
        self.kv_store: KvStore | None = None  # saved KV caches (engine.kv_store), set at load
        self.pair_layout: PairLayout | None = None  # a reranker's (query, document) layout, set at load
        self._tool_call_formats: dict[str, str] = {}  # set at load (tool_call_formats)
        self._asleep: ContextSettings | None = None  # the context's settings while it sleeps
        self._closing = threading.Event()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"llama_cpp:{model_name}:{replica_index}")
        self.lora = LoraSet()  # the definition's LoRA adapters, loaded with the weights
        self._speculation = Speculation(SpeculationSettings.from_config(config))  # its draft model set at load
        self._delivery = StepDelivery()
        self._batches = BatchLoop(model_name, lambda: (self.context, self.kv_store), self.lora, self._speculation,
                                  self._delivery.flush)

    # -- lifecycle -----------------------------------------------------------------------
    async def load(self) -> None:
        self._progress = ThreadedFraction(self._progress_context, STAGE_LOADING_WEIGHTS)
        await asyncio.get_running_loop().run_in_executor(self._worker, self._load)

    async def unload(self) -> None:
        """Stop a running generation at its next token, free the context and the weights.

        Idempotent; the replica cannot be loaded again afterwards (the controller makes new ones).
        """
        if self._closing.is_set():
            return
        self._closing.set()
        try:
            await asyncio.get_running_loop().run_in_executor(self._worker, self._release)
        finally:
            self._worker.shutdown(wait=False)

    def _load(self) -> None:
        try:
            self._open()
        except BaseException:
            self._release()
            raise

    def _open(self) -> None:
        try:
            path = resolve_model_file(self.config.get("model_path"), self.base_dir)
            info = read_gguf_info(path)
        except (ModelFileError, GgufError) as exc:
            raise EngineLoadError(str(exc)) from None
        except OSError as exc:
            raise EngineLoadError(f"model file cannot be read: {exc}") from None
        pooling = context_pooling(self.config, info, path)
        chats = pooling != "rank"  # a reranker scores pairs: no chat template, no tool calls
        if chats and self.prompt_format == GGUF_TEMPLATE:
            if info.chat_template is None:
                raise EngineLoadError(
                    f"{path} carries no chat template (tokenizer.chat_template); set prompt_format to one of "
                    "generic, mistral_template, qwen3_template, gemma4_template, translategemma_template"
                )
            _probe_template(info.chat_template, path)  # before any weights are read
        settings = dataclasses.replace(ContextSettings.from_config(self.config), pooling=pooling)
        self.weights = GgufWeights(path, self.config["gguf_n_gpu_layers"], on_progress=self._progress,
                                   main_gpu=main_gpu(self.config.get("placement")))
        if self._progress is not None:
            self._progress.stage_now(STAGE_CREATING_CONTEXT)
        self.lora.sync(self.weights, self.config, self.base_dir)
        self.context = GgufContext(self.weights, settings)
        self.pair_layout = PairLayout.of(self.weights, info) if pooling == "rank" else None
        self._open_kv_store()
        if self._speculation.settings.spec_type == "draft-simple":
            self._speculation.draft_model = DraftModel.of_config(self.config, self.base_dir, settings, self.weights,
                                                                 main_gpu(self.config.get("placement")))
        if chats and self.prompt_format == GGUF_TEMPLATE:
            bos, eos = self.weights.token_text(self.weights.bos), self.weights.token_text(self.weights.eos)
            self.gguf_template = GgufChatTemplate(info.chat_template, bos, eos)
        self._tool_call_formats = self._resolve_tool_call_formats() if chats else {}
        logger.info(
            "model %s replica %d loaded from %s (%s, threads=%d)",
            self.model_name, self.replica_index + 1, path, settings.describe(), settings.n_threads,
        )

    def _open_kv_store(self) -> None:
        """The saved KV caches of this model file under the context's settings (None: off)."""
        context = self._progress_context
        self.kv_store = KvStore.from_settings(context.get("kv_store"), context.get("state_dir"), self.weights.path,
                                              self.context.settings, llama_version())

    def _save_kv(self) -> None:
        """Write the context's sequences to the KV store before the context goes (unload,
        sleep), the most recently used last: the store's budget drops the oldest first."""
        if self.kv_store is not None and self.context is not None:
            for seq in self._batches.recency():
                if self.lora.held(seq) is not None:  # an adapter's cache: the store keeps the base's
                    continue
                try:
                    self.kv_store.save(self.context, seq)
                except Exception:  # a failed save loses a cache, never the unload
                    logger.exception("model %s: saving the KV cache failed", self.model_name)

    # -- inference state (runtime.model.residency) -----------------------------------------------
    async def reconfigure(self, config: dict[str, Any], overlap: bool = False) -> None:
        """A new context over the same weights with ``config``'s n_ctx, flash attention and K/V
        types.  ``overlap`` (make-before-break, where memory allows both): the new context is
        built while the old one still exists, which is freed only once the new one stands; else
        break-then-make: the old one is freed first, so the peak stays one context.  If llama.cpp
        rejects the new one, the old one serves on (rebuilt after a break) and the rejection
        raises InvalidLoadRequest (InsufficientMemory when it ran out of memory)."""
        await asyncio.get_running_loop().run_in_executor(self._worker, self._reconfigure, config, overlap)

    async def sleep(self) -> None:
        """Free the context (KV cache, compute buffers); the weights stay mapped."""
        await asyncio.get_running_loop().run_in_executor(self._worker, self._sleep)

    async def wake(self) -> None:
        """Build the context again with the settings it had before ``sleep``."""
        await asyncio.get_running_loop().run_in_executor(self._worker, self._wake)

    def _reconfigure(self, config: dict[str, Any], overlap: bool = False) -> None:
        if self.weights is None:
            raise BackendError(f"model {self.model_name} replica {self.replica_index + 1} is not loaded")
        old = self.context.settings if self.context is not None else self._asleep
        new = dataclasses.replace(ContextSettings.from_config(config), pooling=old.pooling)
        self.lora.resync(self.weights, config, self.base_dir)  # first: a file it refuses changes nothing
        if new == old:  # only adapters_loaded changes: the context and its caches stay
            self.config = config
            return
        previous = self.context if overlap else None  # make-before-break: kept until the new one stands
        if self.context is not None and previous is None:
            self.context.close()
            self.context = None
            release_heap()
        try:
            self.context = GgufContext(self.weights, new)
        except EngineLoadError as exc:
            # The configuration that served before: still there, or rebuilt after a break.
            self.context = previous if previous is not None else GgufContext(self.weights, old)
            self.lora.sync(self.weights, self.config, self.base_dir)  # the adapters that served with it
            if previous is None:
                self.lora.forget()
            if OOM_WORDS.search(str(exc)):
                raise InsufficientMemory(str(exc)) from None
            raise InvalidLoadRequest(str(exc)) from None
        if previous is not None:
            previous.close()
            release_heap()
        self.lora.forget()
        self._asleep = None
        self.config = config
        self._open_kv_store()  # another n_ctx or cache type: another identity
        logger.info("model %s replica %d reconfigured (%s, %s)", self.model_name, self.replica_index + 1, new.describe(),
                    "make-before-break" if overlap else "break-then-make")

    def _sleep(self) -> None:
        if self.context is not None:
            self._save_kv()
            self._asleep = self.context.settings
            self.context.close()
            self.context = None
            release_heap()

    def _wake(self) -> None:
        if self.context is None and self._asleep is not None and self.weights is not None:
            self.context = GgufContext(self.weights, self._asleep)
            self.lora.forget()
            self._asleep = None

    def _release(self) -> None:
        self._speculation.close()
        if self.context is not None:
            self._save_kv()
            self.context.close()
            self.context = None
        self.lora.close()
        if self.weights is not None:
            self.weights.close()
            self.weights = None
        release_heap()

    # -- tools -----------------------------------------------------------------------------
    def _resolve_tool_call_formats(self) -> dict[str, str]:
        configured = self.config.get("tool_call_format", "auto")
        if configured == "none":
            return {}
        answer = tool_call_format(self.prompt_format, self.gguf_template) if configured == "auto" else configured
        return {"auto": answer, "required": "json", "function": "json"}

    def tool_call_formats(self) -> dict[str, str]:
        """The format of the answer per tool_choice kind (runtime.inference.tool_calls.format_for): the
        model's own for "auto", ``json`` where the grammar constrains it; empty without tools."""
        return dict(self._tool_call_formats)

    def tool_call_format(self, request: GenerationRequest) -> str | None:
        return format_for(self._tool_call_formats, request)

    def _offers_tools(self, request: GenerationRequest) -> bool:
        return bool(self._tool_call_formats) and bool(request.tools) and choice_kind(request.tool_choice) != "none"

    def grammar(self, request: GenerationRequest) -> str | None:
        """The GBNF that keeps the answer to the tools' calls, for tool_choice "required" or a
        named function (a list of calls only where parallel_tool_calls is true); else None."""
        if not self._offers_tools(request) or choice_kind(request.tool_choice) not in ("required", "function"):
            return None
        schema = constrained_schema(request.tools, request.tool_choice, request.parallel_tool_calls is True)
        try:
            return grammar_of_schema(schema)
        except ValueError as exc:
            raise InvalidRequest(
                f"the tools' parameters cannot be turned into a grammar for tool_choice: {exc}", param="tools"
            ) from None

    # -- generation ------------------------------------------------------------------------
    def render(self, request: GenerationRequest) -> RenderedPrompt:
        """The prompt for ``request`` (raises the request's 400 errors before any work is queued).

        A raw prompt (``request.prompt``) is tokenized as llama-cpp-python's ``create_completion``
        tokenizes one: as it is, special tokens parsed, BOS first when the vocabulary wants it.
        """
        if self.pair_layout is not None:
            raise InvalidRequest(f"model {self.model_name} is a reranker (rerank: true): it answers POST /v1/rerank "
                                 "only", param="model")
        if request.prompt is not None:
            return RenderedPrompt(((request.prompt, True),))
        messages = conversation_turns(request.instructions, request.messages)
        thinking = resolve_thinking(request.thinking, self.config.get("enable_thinking"))
        return render_prompt(
            self.prompt_format, messages, thinking=thinking, extra=request.extra, gguf_template=self.gguf_template,
            tools=request.tools if self._offers_tools(request) else None,
        )

    async def count_tokens(self, request: GenerationRequest) -> int:
        """The tokens of ``request``'s prompt as ``generate`` renders (chat template, tools) and
        tokenizes it.  Tokenizing reads the vocabulary only, so it runs beside a generation."""
        if self.weights is None or self._closing.is_set():
            raise BackendError(f"model {self.model_name} replica {self.replica_index + 1} is not loaded")
        prompt = self.render(request)
        return len(await asyncio.to_thread(self.weights.tokenize_prompt, prompt))

    async def generate(self, request: GenerationRequest):
        if self.context is None or self._closing.is_set():
            raise BackendError(f"model {self.model_name} replica {self.replica_index + 1} is not loaded")
        prompt = self.render(request)
        options = sampling_options(request, self.grammar(request))
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancelled = threading.Event()
        emit = self._delivery.emitter(loop, queue, cancelled.set)
        generation = Generation(self.weights, prompt, request, options, emit,
                                lambda: cancelled.is_set() or self._closing.is_set(), self.model_name)
        try:
            self._batches.submit(generation, self._worker)
        except RuntimeError:  # unloaded between the check above and now
            raise BackendError(f"model {self.model_name} replica {self.replica_index + 1} is not loaded") from None
        try:
            async for item in drain(queue):
                yield item
        finally:
            cancelled.set()

    # -- embeddings (runtime.inference.embedding) and rerank (runtime.inference.rerank) -------------
    async def embed(self, inputs, *, dimensions: int | None = None) -> tuple[list[list[float]], int]:
        """The L2-normalized pooled vector of each input (``embeddings: true``), on the worker
        thread between generations; ``dimensions`` is refused before it gets here."""
        return await self._pooled("embedding", self._embed, inputs)

    async def rerank(self, query: str, documents: list[str]) -> tuple[list[float], int]:
        """Each document's score against ``query`` (``rerank: true``, runtime.backends.llama_cpp.rerank),
        on the worker thread between generations."""
        return await self._pooled("rerank", self._rerank, query, documents)

    async def _pooled(self, what: str, work, *args):
        """``work(*args, cancelled)`` on the worker thread; a caller gone stops it before its next input."""
        if self.context is None or self._closing.is_set():
            raise BackendError(f"model {self.model_name} replica {self.replica_index + 1} is not loaded")
        cancelled = threading.Event()
        try:
            running = asyncio.get_running_loop().run_in_executor(self._worker, self._guarded, what, work, *args,
                                                                 cancelled)
        except RuntimeError:  # unloaded between the check above and now
            raise BackendError(f"model {self.model_name} replica {self.replica_index + 1} is not loaded") from None
        try:
            return await running
        finally:
            cancelled.set()

    def _guarded(self, what: str, work, *args):
        """``work(*args)`` on the base (no adapter); a native failure ends this request
        (BackendError), not the worker."""
        try:
            if self.context is not None:
                self.lora.apply(self.context, None)
            return work(*args)
        except LLMPoolError:
            raise
        except Exception as exc:
            logger.exception("model %s: %s failed", self.model_name, what)
            raise BackendError(f"llama.cpp {what} failed: {exc}") from None

    def _rerank(self, query: str, documents: list[str], cancelled: threading.Event) -> tuple[list[float], int]:
        context = self.context
        if context is None or self.pair_layout is None:
            raise BackendError(f"model {self.model_name} was unloaded before the request ran")
        return score_pairs(self.weights, context, self.pair_layout, query, documents,
                           lambda: cancelled.is_set() or self._closing.is_set(), self.model_name)

    def _embed(self, inputs, cancelled: threading.Event) -> tuple[list[list[float]], int]:
        weights, context = self.weights, self.context
        if context is None or context.settings.pooling is None:
            raise BackendError(f"model {self.model_name} was unloaded before the request ran")
        vectors, total = [], 0
        for index, item in enumerate(inputs):
            if cancelled.is_set() or self._closing.is_set():
                raise BackendError("the embedding request was cancelled")
            tokens = weights.tokenize_input(item) if isinstance(item, str) else self._checked_tokens(index, item)
            if not tokens:
                raise InvalidRequest(f"input[{index}] holds no token", param="input")
            if len(tokens) > context.n_ubatch:
                raise ContextLengthExceeded(
                    f"input[{index}] is {len(tokens)} tokens but model {self.model_name} embeds at most "
                    f"{context.n_ubatch} tokens per input (gguf_n_batch, within gguf_n_ctx)",
                    param="input",
                )
            vectors.append(normalized(context.embed(tokens)))
            total += len(tokens)
        return vectors, total

    def _checked_tokens(self, index: int, tokens: list[int]) -> list[int]:
        n_vocab = self.weights.n_vocab
        for token in tokens:
            if not 0 <= token < n_vocab:
                raise InvalidRequest(
                    f"input[{index}] holds token {token}, outside the vocabulary of model {self.model_name} "
                    f"(0 to {n_vocab - 1})",
                    param="input",
                )
        return list(tokens)


def _probe_template(template: str, path: str) -> None:
    """Render the GGUF's template once for a one-message chat, so an unsafe or broken template
    fails the load instead of every request."""
    try:
        render_chat_template(template, [{"role": "user", "content": "ping"}], bos_token="<s>", eos_token="</s>")
    except UnsafeTemplate as exc:
        raise EngineLoadError(f"{path}: {exc}") from None
    except TemplateRenderError as exc:
        raise EngineLoadError(f"{path}: the chat template cannot render a single user message: {exc}") from None


def main_gpu(placement, visible: str | None = None) -> int:
    """llama.cpp's main_gpu for a load placed on ``placement``: the index of its first GPU among
    those this process sees (CUDA_VISIBLE_DEVICES, which an engine process placed on GPUs gets
    from runtime.engine_process: then 0); 0 on cpu or without a placement."""
    gpus = [int(device.split(":")[1]) for device in placement or () if device.startswith("cuda:")]
    if not gpus:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if visible:
        shown = [item.strip() for item in visible.split(",")]
        return shown.index(str(gpus[0])) if str(gpus[0]) in shown else 0
    return gpus[0]

