"""The stub backend: a deterministic engine for tests, demos and capability checks.

Every knob is in the definition: load time, load failure (for all replicas or
one), per-token delay, the reply, a reported VRAM size, and the capabilities
the model advertises, so every lifecycle and request rule can be exercised
without a real model.

The reply is ``stub_reply`` when set, else the text of the last user message, or, for a raw
prompt (``GenerationRequest.prompt``, POST /v1/completions), the prompt itself; it streams as
``stub_tokens`` pieces (whitespace-led words) and its ``input_tokens`` count the words of the
instructions and text parts, or of the raw prompt.

Tool calls are scripted with ``stub_tool_calls``: a request that offers tools (tool_choice not
"none") and whose conversation does not end with a tool result is answered with those calls in
the ``hermes`` format (``<tool_call>{"name", "arguments"}</tool_call>``, the markup split over
several deltas), which the runtime's parser reads as it would a model's; one whose conversation
ends with a tool result is answered ``stub_reply``, else that result's text.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import signal
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from runtime.backends.base import (
    THINK_TAGS,
    TOOL_CHOICES,
    BackendSpec,
    CommonDefinition,
    Finished,
    GenerationRequest,
    TextDelta,
)
from runtime.backends.shared.vectors import normalized
from runtime.errors import BackendError
from runtime.model.load_progress import STAGE_STUB_LOADING
from runtime.model.load_progress import report as report_progress
from runtime.inference.tool_calls import HERMES_CLOSE, HERMES_OPEN, choice_kind, chosen_name, format_for

_TOKEN = re.compile(r"\s*\S+")
STUB_LOAD_STEPS = 10  # stub_load_seconds is waited in this many reported steps


def stub_tokens(text: str) -> list[str]:
    """Whitespace-delimited pieces that concatenate back to ``text`` (minus trailing space)."""
    return _TOKEN.findall(text)


class StubToolCall(BaseModel):
    """One scripted call: ``arguments`` an object (written as JSON), or a string written as it
    is (one that is not JSON scripts a broken call, which the runtime gives back as text)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(min_length=1)
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class StubDefinition(CommonDefinition):
    backend: Literal["stub"]
    stub_load_seconds: float = Field(0.0, ge=0, le=3600)
    stub_unload_seconds: float = Field(0.0, ge=0, le=3600)
    stub_fail_load: str | None = None
    stub_fail_replica: int | None = Field(None, ge=0)
    stub_token_delay_ms: float = Field(0.0, ge=0, le=60000)
    stub_reply: str | None = None
    stub_fail_after_tokens: int | None = Field(None, ge=0)
    # Its memory cost on whatever device it is placed on (cpu included): the estimate, and what a
    # load measures unless stub_observed_mib says otherwise (runtime.pool.memory).
    stub_vram_mib: int | None = Field(None, ge=0)
    stub_observed_mib: int | None = Field(None, ge=0)
    # The warm tier (runtime.model.residency): set, the stub can sleep, and holds this much asleep (its
    # estimate and what it measures then); null: not sleepable.
    stub_sleep_mib: int | None = Field(None, ge=0)
    stub_remote: bool = False
    # The context length it reports (runtime.pool.model_card); null: none.
    stub_context_length: int | None = Field(None, ge=1)
    # Allocate this much GPU memory with torch while loaded (scripts/gpu_check.sh checks
    # observed_load_delta against it); needs torch with CUDA.
    stub_gpu_alloc_mib: int | None = Field(None, ge=1)
    # Crash injection: the engine process really dies by stub_crash_signal when it loads or
    # when a generation starts.  Refused with isolation "none" (it would kill the service).
    stub_crash: Literal["on_load", "on_generate"] | None = None
    stub_crash_signal: Literal["SIGSEGV", "SIGABRT", "SIGKILL"] = "SIGSEGV"
    # A stuck engine: a generation whose prompt text (or an embedding input) contains this string
    # blocks the engine process's event loop for good (as a chat template that never ends rendering would), so it
    # answers no cancel.  Refused with isolation "none" (it would block the service).
    stub_spin_on: str | None = Field(None, min_length=1)
    thinking_modes: list[Literal["default", "enabled", "disabled"]] = Field(default_factory=lambda: ["default"])
    response_formats: list[Literal["text", "json_schema"]] = Field(default_factory=lambda: ["text"])
    multi_turn: bool = True
    file_inputs: bool = False
    raw_prompt: bool = True
    # What the stub honours of the sampling options: a seed (its answer is the same whatever the
    # seed) and logprobs (each token is certain: logprob 0.0, its only alternative itself).
    sampling_options: list[Literal["seed", "presence_penalty", "frequency_penalty", "logprobs", "top_k",
                                   "repeat_penalty"]] = Field(
        default_factory=lambda: ["seed", "logprobs"]
    )
    # A thinking model's reasoning, scripted: unless the request's thinking is "disabled", the
    # output is <start tag> stub_reasoning <end tag> "\n\n" before the reply (the tags are
    # reasoning_tags, <think>/</think> by default), so the runtime's split can be tested exactly.
    stub_reasoning: str | None = None
    # POST /v1/embeddings (runtime.inference.embedding): each input's vector is ``stub_embedding`` of it, of
    # this size; stub_token_delay_ms is waited once per input.
    embeddings: bool = False
    stub_embedding_dimensions: int = Field(8, ge=1, le=65536)
    # POST /v1/rerank (runtime.inference.rerank): each document's score is ``stub_relevance`` of it
    # against the query; stub_token_delay_ms is waited once per document.
    rerank: bool = False
    # Tool calling (capabilities.tools): null: true exactly when stub_tool_calls is set.
    tools: bool | None = None
    # The tool_choice kinds honoured (capabilities.tool_choice); null: all of them where tools.
    tool_choice: list[Literal["none", "auto", "required", "function"]] | None = None
    # The calls the stub answers a request that offers tools with (see the module's doc); a
    # named tool_choice gets those of that name only.
    stub_tool_calls: list[StubToolCall] | None = None
    # Text the stub writes before its calls (so text and calls in one answer can be tested).
    stub_tool_preamble: str | None = None

    @model_validator(mode="after")
    def _crash_only_in_an_engine_process(self):
        if self.stub_crash is not None and self.isolation != "process":
            raise ValueError(
                f"stub_crash={self.stub_crash!r} needs isolation \"process\": with isolation "
                f"{self.isolation!r} the crash would kill the service"
            )
        if self.stub_spin_on is not None and self.isolation != "process":
            raise ValueError(
                f"stub_spin_on needs isolation \"process\": with isolation {self.isolation!r} the "
                "stuck engine would block the service"
            )
        return self


class StubEngine:
    def __init__(self, config: dict[str, Any], replica_index: int, context: dict | None = None):
        self.config = config
        self.replica_index = replica_index
        self.context = context or {}
        self.loaded = False
        self.asleep = False
        self.gpu_block = None

    async def load(self) -> None:
        # stub_load_seconds in STUB_LOAD_STEPS steps, each reported (runtime.model.load_progress).
        seconds = self.config["stub_load_seconds"]
        if not seconds:
            await asyncio.sleep(0)
        for done in range(STUB_LOAD_STEPS if seconds else 0):
            report_progress(self.context, STAGE_STUB_LOADING, done / STUB_LOAD_STEPS)
            await asyncio.sleep(seconds / STUB_LOAD_STEPS)
        report_progress(self.context, STAGE_STUB_LOADING, 1.0)
        self._crash_if("on_load")
        failing_replica = self.config["stub_fail_replica"]
        if self.config["stub_fail_load"] and failing_replica in (None, self.replica_index):
            raise RuntimeError(self.config["stub_fail_load"])
        if self.config["stub_gpu_alloc_mib"]:
            self.gpu_block = await asyncio.to_thread(_allocate_gpu_mib, self.config["stub_gpu_alloc_mib"])
        self.loaded = True

    def memory_mib(self) -> int | None:
        """What this replica holds, as a load measures it (runtime.model.memory_claim.measure_engines)."""
        if self.asleep:
            return self.config["stub_sleep_mib"]
        observed = self.config["stub_observed_mib"]
        return observed if observed is not None else self.config["stub_vram_mib"]

    async def sleep(self) -> None:
        """The warm tier (``stub_sleep_mib``): it holds ``stub_sleep_mib`` until ``wake``."""
        await asyncio.sleep(0)
        self.asleep = True

    async def wake(self) -> None:
        await asyncio.sleep(0)
        self.asleep = False

    def _crash_if(self, moment: str) -> None:
        """Die by stub_crash_signal at ``moment`` (settings allow it only in an engine process)."""
        if self.config["stub_crash"] == moment:
            os.kill(os.getpid(), signal.Signals[self.config["stub_crash_signal"]])

    def tool_call_formats(self) -> dict[str, str]:
        """The stub writes its calls in the hermes format whatever the tool_choice (it needs no
        grammar to keep to them)."""
        if not stub_takes_tools(self.config):
            return {}
        return {kind: "hermes" for kind in TOOL_CHOICES if kind != "none"}

    def tool_call_format(self, request: GenerationRequest) -> str | None:
        return format_for(self.tool_call_formats(), request)

    def _tool_call_tokens(self, request: GenerationRequest) -> list[str] | None:
        """The pieces of the scripted calls, or None when the request gets text."""
        calls = self.config["stub_tool_calls"]
        if calls is None or self.tool_call_format(request) is None:
            return None
        turns = [m for m in request.messages if m["role"] in ("user", "assistant", "tool")]
        if turns and turns[-1]["role"] == "tool":
            return None
        wanted = chosen_name(request.tool_choice) if choice_kind(request.tool_choice) == "function" else None
        tokens = stub_tokens(self.config["stub_tool_preamble"] or "")
        for index, call in enumerate(call for call in calls if wanted in (None, call["name"])):
            arguments = call["arguments"]
            arguments = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
            body = f'{{"name": {json.dumps(call["name"], ensure_ascii=False)}, "arguments": {arguments}}}'
            tokens += ["\n" if index or tokens else "", HERMES_OPEN[:5], HERMES_OPEN[5:] + "\n", *stub_tokens(body),
                       "\n" + HERMES_CLOSE[:6], HERMES_CLOSE[6:]]
        return [token for token in tokens if token]

    def _reasoning_tokens(self, request: GenerationRequest) -> list[str]:
        reasoning = self.config["stub_reasoning"]
        if reasoning is None or request.thinking == "disabled":
            return []
        start, end = self.config["reasoning_tags"] or THINK_TAGS
        return [start, *stub_tokens(reasoning), end, "\n\n"]

    async def embed(self, inputs, *, dimensions: int | None = None) -> tuple[list[list[float]], int]:
        """``stub_embedding`` of each input; its tokens are its words (``stub_tokens``) or its ids."""
        if not self.loaded:
            raise BackendError("the stub engine is not loaded")
        delay = self.config["stub_token_delay_ms"] / 1000.0
        spin_on = self.config["stub_spin_on"]
        if spin_on is not None and any(isinstance(item, str) and spin_on in item for item in inputs):
            _block_forever()
        vectors, tokens = [], 0
        for item in inputs:
            if delay:
                await asyncio.sleep(delay)
            vectors.append(stub_embedding(item, self.config["stub_embedding_dimensions"]))
            tokens += len(stub_tokens(item)) if isinstance(item, str) else len(item)
        return vectors, tokens

    async def rerank(self, query: str, documents: list[str]) -> tuple[list[float], int]:
        """``stub_relevance`` of each document; a pair's tokens are the words of both."""
        if not self.loaded:
            raise BackendError("the stub engine is not loaded")
        spin_on = self.config["stub_spin_on"]
        if spin_on is not None and any(spin_on in text for text in (query, *documents)):
            _block_forever()
        delay = self.config["stub_token_delay_ms"] / 1000.0
        scores, tokens = [], 0
        for document in documents:
            if delay:
                await asyncio.sleep(delay)
            scores.append(stub_relevance(query, document))
            tokens += len(stub_tokens(query)) + len(stub_tokens(document))
        return scores, tokens

    async def unload(self) -> None:
        await asyncio.sleep(self.config["stub_unload_seconds"])
        if self.gpu_block is not None:
            self.gpu_block = None
            await asyncio.to_thread(_release_gpu_cache)
        self.loaded = False

    async def count_tokens(self, request: GenerationRequest) -> int:
        """The words the stub reads of ``request``: its generate's ``input_tokens``."""
        return len(stub_tokens(_prompt_text(request)))

    async def generate(self, request: GenerationRequest):
        self._crash_if("on_generate")
        prompt_text = _prompt_text(request)
        spin_on = self.config["stub_spin_on"]
        if spin_on is not None and spin_on in prompt_text:
            _block_forever()
        calls = self._tool_call_tokens(request)
        reply = self.config["stub_reply"]
        if reply is None:
            reply = request.prompt if request.prompt is not None else _last_text(request)
        tokens = self._reasoning_tokens(request) + (calls if calls is not None else stub_tokens(reply))
        input_tokens = len(stub_tokens(prompt_text))
        delay = self.config["stub_token_delay_ms"] / 1000.0
        fail_after = self.config["stub_fail_after_tokens"]
        emitted = 0
        for token in tokens[: request.max_output_tokens]:
            if fail_after is not None and emitted >= fail_after:
                raise BackendError(f"stub engine failed after {emitted} tokens (stub_fail_after_tokens)")
            if delay:
                await asyncio.sleep(delay)
            emitted += 1
            yield TextDelta(token, logprobs=None if request.logprobs is None else [_certain(token, request.logprobs)])
        reason = "length" if len(tokens) > request.max_output_tokens else "stop"
        yield Finished(input_tokens=input_tokens, output_tokens=emitted, finish_reason=reason)


def stub_takes_tools(definition: dict) -> bool:
    """capabilities.tools of a stub definition (a dict: the definition dumped, or its config)."""
    if definition["tools"] is not None:
        return definition["tools"]
    return definition["stub_tool_calls"] is not None


def _prompt_text(request: GenerationRequest) -> str:
    """The raw prompt, else the instructions and every text part (what the stub counts as input)."""
    if request.prompt is not None:
        return request.prompt
    return " ".join(
        [request.instructions or ""]
        + [p.get("text", "") for m in request.messages for p in m["content"] if p.get("type") == "input_text"]
    )


def _block_forever() -> None:
    """``stub_spin_on``: never return, never yield to the event loop (short sleeps rather than a busy
    loop, so that a test does not take a core)."""
    while True:
        time.sleep(0.05)


def _last_text(request: GenerationRequest) -> str:
    """The text of the last user message, or of the last tool result where that ends the conversation."""
    turns = [m for m in request.messages if m["role"] in ("user", "assistant", "tool")]
    if turns and turns[-1]["role"] == "tool":
        return "".join(p.get("text", "") for p in turns[-1]["content"] if p.get("type") == "input_text")
    return request.last_user_text()


def stub_embedding(item: str | list[int], dimensions: int) -> list[float]:
    """The stub's vector of one input, for exact tests: the first ``dimensions`` bytes of the
    SHAKE-256 digest of its UTF-8 text (a token array: its ids joined by single spaces), each byte
    ``b`` as ``(b - 127.5) / 127.5``, the whole scaled to unit length."""
    text = item if isinstance(item, str) else " ".join(str(token) for token in item)
    digest = hashlib.shake_256(text.encode("utf-8")).digest(dimensions)
    return normalized([(byte - 127.5) / 127.5 for byte in digest])


def stub_relevance(query: str, document: str) -> float:
    """The stub's score of one document, for exact tests: the share of the query's distinct words
    (lower-cased, split on whitespace) that are words of the document, 0.0 for a query of none."""
    wanted = set(query.lower().split())
    return len(wanted & set(document.lower().split())) / len(wanted) if wanted else 0.0


def _certain(token: str, alternatives: int) -> dict:
    """The logprobs entry of a token the stub was certain of (its only alternative is itself)."""
    entry = {"token": token, "logprob": 0.0, "bytes": list(token.encode("utf-8"))}
    return {**entry, "top_logprobs": [entry] if alternatives else []}


def _allocate_gpu_mib(mib: int):
    try:
        import torch
    except ImportError as exc:
        raise RuntimeError("stub_gpu_alloc_mib needs torch with CUDA") from exc
    if not torch.cuda.is_available():
        raise RuntimeError("stub_gpu_alloc_mib needs a CUDA device; none is visible")
    block = torch.empty(mib * 1024 * 1024, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    return block


def _release_gpu_cache() -> None:
    import torch

    torch.cuda.empty_cache()


class StubSpec(BackendSpec):
    name = "stub"
    definition_model = StubDefinition

    def multi_turn(self, definition: StubDefinition) -> bool:
        return definition.multi_turn

    def context_length(self, config):
        return config.get("stub_context_length")

    def thinking_modes(self, definition: StubDefinition) -> list[str]:
        return list(definition.thinking_modes)

    def response_formats(self, definition: StubDefinition) -> list[str]:
        return list(definition.response_formats)

    def file_inputs(self, definition: StubDefinition) -> bool:
        return definition.file_inputs

    def raw_prompt(self, definition: StubDefinition) -> bool:
        return definition.raw_prompt

    def sampling_options(self, definition: StubDefinition) -> list[str]:
        return list(definition.sampling_options)

    def tools(self, definition: StubDefinition) -> bool:
        return stub_takes_tools(definition.model_dump())

    def tool_choices(self, definition: StubDefinition) -> list[str]:
        if definition.tool_choice is not None and self.tools(definition):
            return list(definition.tool_choice)
        return super().tool_choices(definition)

    def reasoning_tags(self, definition: StubDefinition, base_dir: str) -> tuple[str, str] | None:
        if definition.reasoning_tags is None and definition.stub_reasoning is not None:
            return THINK_TAGS
        return super().reasoning_tags(definition, base_dir)

    def is_remote(self, definition: StubDefinition) -> bool:
        return definition.stub_remote

    def create_engine(self, model_name, config, replica_index, context):
        return StubEngine(config, replica_index, context)

    def default_device(self, definition: StubDefinition) -> str:
        return "cpu"

    def can_sleep(self, definition: StubDefinition) -> bool:
        return definition.stub_sleep_mib is not None

    def sleeping_mib(self, definition: StubDefinition, config, base_dir, awake_mib):
        if definition.stub_sleep_mib is None:
            return awake_mib
        return min(awake_mib, definition.stub_sleep_mib)

    def vram_estimate(self, definition: StubDefinition, config, replicas, base_dir):
        if definition.stub_vram_mib is None:
            return None, "unavailable"
        return definition.stub_vram_mib * replicas, "model_artifact_size"
