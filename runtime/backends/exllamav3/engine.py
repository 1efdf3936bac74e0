"""The ExLlamaV3 engine: Config, Model, Cache, Tokenizer and a Generator per replica.

Follows the loading sequence of ExLlamaV3's README and examples:
``Config.from_directory`` -> ``Model.from_config`` -> ``Cache(model, ...)`` ->
``model.load(...)`` -> ``Tokenizer.from_config`` -> ``Generator(model=, cache=,
tokenizer=)``.  The effective definition maps to the engine like this:

- ``exllama_cache_size`` -> ``Cache(max_num_tokens=...)``;
- ``exllama_cache_quant`` null -> ``layer_type=CacheLayer_fp16``; ``"<bits>"`` or
  ``"<k_bits>,<v_bits>"`` -> ``layer_type=CacheLayer_quant, k_bits=, v_bits=``
  (the spec parses the string into ``cache_bits``; a load body's
  ``exllama_cache_k_bits``/``exllama_cache_v_bits`` arrive folded into it);
- ``exllama_gpu_split`` -> ``model.load(use_per_device=...)`` (GiB per device,
  null: ExLlamaV3 places the layers), ``exllama_tensor_parallel`` ->
  ``model.load(tensor_p=...)``;
- ``exllama_max_rq_tokens`` -> ``Job(max_rq_tokens=...)``: a job longer than that
  is requeued, so a long generation does not hold cache pages for ever.

The synchronous ``Generator`` is driven from a thread per request (its
``iterate()`` launches CUDA work and waits for the sampled tokens, which must not
happen on the event loop), so ExLlamaV3's ``AsyncGenerator`` is not used.
Prompts come from the model folder's Hugging Face chat template, rendered in the
sandbox of ``runtime.inputs.chat_templates`` (``enable_thinking`` for Qwen3 / Gemma 4).

Unload calls ``model.unload()`` (the weights leave the device), drops the
generator, cache and tokenizer, runs the garbage collector and
``torch.cuda.empty_cache()`` so PyTorch's caching allocator hands the cache
tensors back to the driver.  The CUDA context and the compiled extension's
workspaces stay until the process exits.
"""
from __future__ import annotations

import asyncio
import gc
import os
import threading
from contextlib import aclosing
from functools import partial
from typing import Any

from runtime.backends.base import EngineUnavailable, Finished, GenerationRequest, TextDelta, resolve_model_path
from runtime.backends.shared.in_process import generate_in_thread
from runtime.backends.shared.prompts import ChatTemplate, template_messages, template_variables
from runtime.errors import BackendError


def import_exllamav3():
    try:
        import exllamav3
    except ImportError as exc:
        raise EngineUnavailable(
            f"ExLlamaV3 is not installed in this environment ({exc}); install exllamav3 "
            "(with a CUDA build of PyTorch) to load models with the exllamav3 backend"
        ) from exc
    return exllamav3


def cache_arguments(cache_size: int, cache_bits: tuple[int, int] | None, exllamav3) -> dict[str, Any]:
    """Keyword arguments of ``Cache(model, ...)``; ``cache_bits`` (k, v) or None for fp16."""
    if cache_bits is None:
        return {"max_num_tokens": cache_size, "layer_type": exllamav3.CacheLayer_fp16}
    k_bits, v_bits = cache_bits
    return {"max_num_tokens": cache_size, "layer_type": exllamav3.CacheLayer_quant, "k_bits": k_bits, "v_bits": v_bits}


def load_arguments(config: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of ``model.load(...)``."""
    return {
        "use_per_device": config["exllama_gpu_split"],
        "tensor_p": config["exllama_tensor_parallel"],
        "progressbar": False,
    }


def _free_cuda_cache() -> None:
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class ExllamaEngine:
    """One replica.  ``_busy`` is held by a running generation and by unload."""

    def __init__(self, config: dict[str, Any], context: dict, cache_bits: tuple[int, int] | None):
        self.config = config
        self.cache_bits = cache_bits
        self.model_path = resolve_model_path(config["model_path"], context["base_dir"])
        self._exllamav3 = None
        self._model = None
        self._cache = None
        self._tokenizer = None
        self._generator = None
        self._template: ChatTemplate | None = None
        self._stop_conditions: list[int] = []
        self._busy = threading.Lock()

    # ---- lifecycle -------------------------------------------------------------------
    async def load(self) -> None:
        await asyncio.to_thread(self._load_blocking)

    def _load_blocking(self) -> None:
        exllamav3 = import_exllamav3()
        if not os.path.isdir(self.model_path):
            raise FileNotFoundError(f"the model folder {self.model_path} does not exist")
        template = ChatTemplate.from_folder(self.model_path)
        config = exllamav3.Config.from_directory(self.model_path)
        model = exllamav3.Model.from_config(config)
        cache = exllamav3.Cache(model, **cache_arguments(self.config["exllama_cache_size"], self.cache_bits, exllamav3))
        try:
            model.load(**load_arguments(self.config))
            tokenizer = exllamav3.Tokenizer.from_config(config)
            generator = exllamav3.Generator(model=model, cache=cache, tokenizer=tokenizer)
        except BaseException:
            model.unload()  # weights already on the device must not outlive a failed load
            raise
        stop_conditions = list(getattr(config, "eos_token_id_list", None) or [])
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in stop_conditions:
            stop_conditions.append(tokenizer.eos_token_id)
        self._exllamav3, self._template, self._stop_conditions = exllamav3, template, stop_conditions
        self._model, self._cache, self._tokenizer, self._generator = model, cache, tokenizer, generator

    async def unload(self) -> None:
        await asyncio.to_thread(self._unload_blocking)

    def _unload_blocking(self) -> None:
        with self._busy:
            model = self._model
            self._model = self._cache = self._tokenizer = self._generator = None
            if model is not None:
                model.unload()
            del model
            gc.collect()
            _free_cuda_cache()

    # ---- generation ------------------------------------------------------------------
    async def generate(self, request: GenerationRequest):
        if self._generator is None:
            raise BackendError("the ExLlamaV3 engine is not loaded")
        if request.prompt is not None:  # a raw prompt: no template, BOS first (as TabbyAPI's completions)
            input_ids = self._tokenizer.encode(request.prompt, add_bos=True, encode_special_tokens=True)
        else:
            prompt = self._template.render(
                template_messages(request), **template_variables(request, self.config["enable_thinking"])
            )
            input_ids = self._tokenizer.encode(prompt, add_bos=False, encode_special_tokens=True)
        produce = partial(self._produce, input_ids, request)
        async with aclosing(generate_in_thread(produce, name="exllama-generate", engine="ExLlamaV3")) as events:
            async for event in events:
                yield event

    def _new_job(self, input_ids, request: GenerationRequest):
        exllamav3 = self._exllamav3
        penalties = {
            name: value
            for name, value in (
                ("pres_p", request.presence_penalty), ("freq_p", request.frequency_penalty),
                ("rep_p", request.repeat_penalty), ("top_k", request.top_k),
            )
            if value is not None
        }
        seed = {} if request.seed is None else {"seed": request.seed}
        return exllamav3.Job(
            input_ids=input_ids,
            max_new_tokens=request.max_output_tokens,
            stop_conditions=self._stop_conditions,
            sampler=exllamav3.ComboSampler(temperature=request.temperature, top_p=request.top_p, **penalties),
            max_rq_tokens=self.config["exllama_max_rq_tokens"],
            identifier=request.request_id,
            **seed,
        )

    def _produce(self, input_ids, request: GenerationRequest, emit, stop: threading.Event) -> None:
        job = self._new_job(input_ids, request)
        final = None
        with self._busy:
            generator = self._generator
            generator.enqueue(job)
            try:
                while final is None and not stop.is_set():
                    for result in generator.iterate():
                        if result.get("stage") != "streaming":
                            continue
                        if result.get("text"):
                            emit(TextDelta(result["text"]))
                        if result["eos"]:
                            final = result
                    if final is None and not generator.num_remaining_jobs():
                        raise BackendError("the ExLlamaV3 generator dropped the job without a result")
            finally:
                if final is None:
                    generator.cancel(job)
        if final is not None:
            reason = "length" if final.get("eos_reason") == "max_new_tokens" else "stop"
            emit(Finished(input_tokens=input_ids.shape[-1], output_tokens=final["new_tokens"], finish_reason=reason))
