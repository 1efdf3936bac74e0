"""The CTranslate2 engine: one ``ctranslate2.Generator`` per replica.

Loading, generation and unloading run in threads, never on the event loop.  A
chat prompt is rendered with the chat template of the Hugging Face tokenizer
beside the converted model (``tokenizer.json`` and ``tokenizer_config.json`` /
``chat_template.jinja``; ``ct2_tokenizer_path`` points elsewhere) in the sandbox of
``runtime.inputs.chat_templates``, tokenized with the ``tokenizers`` library, and fed
to ``generate_tokens``, whose steps stream out as text deltas.

Unloading drops the ``Generator``: its destructor joins CTranslate2's worker
threads and frees the weights.  ``Generator.unload_model`` is not used because
CTranslate2 documents that it may keep the model while a generation is still
winding down.  On CUDA, CTranslate2's caching allocator may keep freed blocks
for reuse by later loads in the same process; the CUDA context itself is only
returned when the process exits.
"""
from __future__ import annotations

import asyncio
import gc
import json
import os
import threading
from contextlib import aclosing
from functools import partial
from typing import Any

from runtime.backends.base import EngineUnavailable, Finished, GenerationRequest, TextDelta, resolve_model_path
from runtime.backends.shared.in_process import generate_in_thread
from runtime.backends.shared.prompts import ChatTemplate, template_messages, template_variables
from runtime.errors import BackendError


def import_ctranslate2():
    try:
        import ctranslate2
        import tokenizers
    except ImportError as exc:
        raise EngineUnavailable(
            f"CTranslate2 is not installed in this environment ({exc.name} is missing); "
            "install the ctranslate2 and tokenizers packages"
        ) from exc
    return ctranslate2, tokenizers


def split_device(device: str | None) -> tuple[str, int]:
    """``None`` -> ("auto", 0); ``"cuda:1"`` -> ("cuda", 1); ``"cpu"`` -> ("cpu", 0)."""
    if device is None or device == "auto":
        return "auto", 0
    if isinstance(device, list):  # tensor parallel over several GPUs
        return "cuda", [int(item.partition(":")[2]) for item in device]
    name, _, index = device.partition(":")
    return name, int(index) if index else 0


def end_token_ids(folder: str, tokenizer, template: ChatTemplate) -> list[int]:
    """Ids that end a reply: generation_config.json's eos_token_id(s) and the tokenizer's eos token."""
    ids: list[int] = []
    try:
        with open(os.path.join(folder, "generation_config.json"), encoding="utf-8") as handle:
            configured = json.load(handle).get("eos_token_id")
    except (OSError, ValueError):
        configured = None
    if configured is not None:
        ids.extend(configured if isinstance(configured, list) else [configured])
    if template.eos_token is not None:
        eos_id = tokenizer.token_to_id(template.eos_token)
        if eos_id is not None and eos_id not in ids:
            ids.append(eos_id)
    return ids


class IncrementalDecoder:
    """Text deltas from a growing list of token ids.

    Decodes a short window (the previous token plus the new ones) so leading
    spaces survive, and holds text back while it ends in an incomplete UTF-8
    sequence (the replacement character).
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        decode = partial(self.tokenizer.decode, skip_special_tokens=True)
        prefix_text = decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = decode(self.ids[self.prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return new_text[len(prefix_text) :]


class Ct2Engine:
    """One replica.  ``_busy`` is held by a running generation and by unload, so the
    generator is never dropped under a generation that is still winding down."""

    def __init__(self, config: dict[str, Any], context: dict):
        base_dir = context["base_dir"]
        self.config = config
        self.model_path = resolve_model_path(config["model_path"], base_dir)
        self.tokenizer_path = resolve_model_path(config["ct2_tokenizer_path"], base_dir) or self.model_path
        self._generator = None
        self._tokenizer = None
        self._template: ChatTemplate | None = None
        self._end_ids: list[int] = []
        self._busy = threading.Lock()

    # ---- lifecycle -------------------------------------------------------------------
    async def load(self) -> None:
        await asyncio.to_thread(self._load_blocking)

    def _load_blocking(self) -> None:
        ctranslate2, tokenizers = import_ctranslate2()
        if not ctranslate2.contains_model(self.model_path):
            raise FileNotFoundError(f"no CTranslate2 model in {self.model_path}")
        tokenizer_file = os.path.join(self.tokenizer_path, "tokenizer.json")
        if not os.path.isfile(tokenizer_file):
            raise FileNotFoundError(f"no Hugging Face tokenizer.json in {self.tokenizer_path}")
        tokenizer = tokenizers.Tokenizer.from_file(tokenizer_file)
        template = ChatTemplate.from_folder(self.tokenizer_path)
        device, device_index = split_device(self.config["device"])
        self._generator = ctranslate2.Generator(
            self.model_path,
            device=device,
            device_index=device_index,
            compute_type=self.config["ct2_compute_type"],
            inter_threads=self.config["ct2_inter_threads"],
            intra_threads=self.config["ct2_intra_threads"],
        )
        self._tokenizer, self._template = tokenizer, template
        self._end_ids = end_token_ids(self.tokenizer_path, tokenizer, template)

    async def unload(self) -> None:
        await asyncio.to_thread(self._unload_blocking)

    def _unload_blocking(self) -> None:
        with self._busy:
            self._generator = None
            self._tokenizer = None
            gc.collect()

    # ---- generation ------------------------------------------------------------------
    async def generate(self, request: GenerationRequest):
        if self._generator is None:
            raise BackendError("the CTranslate2 engine is not loaded")
        if request.prompt is not None:  # a raw prompt: no template; the tokenizer's own BOS rule applies
            encoding = self._tokenizer.encode(request.prompt, add_special_tokens=True)
        else:
            prompt = self._template.render(
                template_messages(request), **template_variables(request, self.config["enable_thinking"])
            )
            encoding = self._tokenizer.encode(prompt, add_special_tokens=False)
        produce = partial(self._produce, encoding.tokens, request)
        async with aclosing(generate_in_thread(produce, name="ct2-generate", engine="CTranslate2")) as events:
            async for event in events:
                yield event

    def _produce(self, prompt_tokens: list[str], request: GenerationRequest, emit, stop: threading.Event) -> None:
        decoder = IncrementalDecoder(self._tokenizer)
        greedy = request.temperature == 0
        output_tokens, finish_reason, unsent = 0, "length", 0
        with self._busy:
            steps = self._generator.generate_tokens(
                prompt_tokens,
                max_batch_size=self.config["ct2_max_batch_size"],
                max_length=request.max_output_tokens,
                sampling_topk=1 if greedy else request.top_k or 0,
                sampling_topp=request.top_p,
                sampling_temperature=1.0 if greedy else request.temperature,
                repetition_penalty=1.0 if request.repeat_penalty is None else request.repeat_penalty,
                end_token=self._end_ids or None,
            )
            try:
                for step in steps:
                    output_tokens += 1
                    if step.token_id in self._end_ids:
                        finish_reason = "stop"
                        break
                    text = decoder.push(step.token_id)
                    unsent += 1
                    if text:
                        emit(TextDelta(text, tokens=unsent))
                        unsent = 0
                    if stop.is_set():
                        return
            finally:
                steps.close()  # stops CTranslate2's decoding loop when we leave early
        emit(Finished(input_tokens=len(prompt_tokens), output_tokens=output_tokens, finish_reason=finish_reason))
