"""Recording stand-ins for the GPU-only engine packages, installed into sys.modules by the tests.

Each fake keeps the public names the engine modules import (the real package
layout) and records every constructor and call with its exact arguments in a
``Recorder``, so a test can assert what the real engine would have received.
Generation replies with ``recorder.reply`` (a list of text pieces, one token
each), honouring the max token count like the real engines.

An engine process does not see the test's ``sys.modules``: ``tests/engines/fake_packages``
holds a ``vllm`` and an ``exllamav3`` package that install these fakes when imported
(``install_for_engine_process``).  A test puts that folder on ``PYTHONPATH`` (the engine
process inherits it) and names a file in ``LLMPOOL_FAKE_RECORDS``, where the recorder in
the engine process appends each call as one JSON line (``recorded_calls`` reads them).
"""
from __future__ import annotations

import asyncio
import enum
import json
import os
import sys
import time
import types
from dataclasses import dataclass, field

QWEN3_STYLE_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)


@dataclass
class Recorder:
    calls: list[tuple[str, dict]] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)
    reply: list[str] = field(default_factory=lambda: ["Hello", " from", " a", " fake"])
    chat_template: str | None = QWEN3_STYLE_TEMPLATE
    fail_load: str | None = None
    step_seconds: float = 0.0  # time each generated token takes
    die_after: int | None = None  # vLLM: the engine dies after this many tokens
    bad_lora_paths: tuple = ()  # vLLM: add_lora of an adapter from one of these raises, as for a missing folder
    sink: str | None = None  # in an engine process: the file each call is appended to

    def record(self, name: str, **arguments) -> None:
        self.calls.append((name, arguments))
        if self.sink is not None:
            with open(self.sink, "a") as sink:
                sink.write(json.dumps([name, arguments], default=lambda value: getattr(value, "__name__", repr(value))))
                sink.write("\n")

    def named(self, name: str) -> list[dict]:
        return [arguments for call, arguments in self.calls if call == name]

    def names(self) -> list[str]:
        return [call for call, _ in self.calls]


def _module(monkeypatch, name: str, **attributes) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def _prompt_ids(recorder: Recorder, text: str) -> list[int]:
    """One id per character: enough for exact usage counts."""
    recorder.prompts.append(text)
    return [ord(char) % 50000 for char in text]


# ---- vLLM ------------------------------------------------------------------------------


def install_fake_vllm(monkeypatch) -> Recorder:
    recorder = Recorder()

    class RequestOutputKind(enum.Enum):
        CUMULATIVE = 0
        DELTA = 1
        FINAL_ONLY = 2

    class AsyncEngineArgs:
        def __init__(self, **kwargs):
            recorder.record("AsyncEngineArgs", **kwargs)
            self.kwargs = kwargs

    class SamplingParams:
        def __init__(self, **kwargs):
            recorder.record("SamplingParams", **kwargs)
            self.kwargs = kwargs

    class Tokenizer:
        bos_token = "<|endoftext|>"
        eos_token = "<|im_end|>"

        def __init__(self):
            self.chat_template = recorder.chat_template

        def encode(self, text, add_special_tokens=True):
            recorder.record("encode", add_special_tokens=add_special_tokens)
            return _prompt_ids(recorder, text)

    class AsyncLLM:
        errored = False

        @classmethod
        def from_engine_args(cls, engine_args):
            recorder.record("from_engine_args", engine_args=engine_args.kwargs)
            if recorder.fail_load:
                raise RuntimeError(recorder.fail_load)
            return cls()

        def get_tokenizer(self):
            return Tokenizer()

        async def generate(self, prompt, sampling_params, request_id, lora_request=None):
            recorder.record("generate", prompt=prompt, request_id=request_id,
                            lora_request=None if lora_request is None else vars(lora_request))
            pieces = recorder.reply[: sampling_params.kwargs["max_tokens"]]
            length = len(recorder.reply) > sampling_params.kwargs["max_tokens"]
            for index, piece in enumerate(pieces):
                await asyncio.sleep(recorder.step_seconds)
                if index == recorder.die_after:
                    self.errored = True
                    raise RuntimeError("EngineCore encountered an issue")
                last = index == len(pieces) - 1
                reason = ("length" if length else "stop") if last else None
                completion = types.SimpleNamespace(text=piece, token_ids=[index], finish_reason=reason)
                if sampling_params.kwargs.get("logprobs") is not None:  # the sampled token ranks first
                    completion.logprobs = [{
                        index: types.SimpleNamespace(logprob=-0.25, rank=1, decoded_token=piece),
                        90000 + index: types.SimpleNamespace(logprob=-1.5, rank=2, decoded_token="~"),
                    }]
                yield types.SimpleNamespace(outputs=[completion], finished=last)

        async def add_lora(self, lora_request):
            recorder.record("add_lora", lora_request=vars(lora_request))
            if lora_request.lora_path in recorder.bad_lora_paths:
                raise RuntimeError(f"Loading lora {lora_request.lora_path} failed")
            return True

        async def remove_lora(self, lora_id):
            recorder.record("remove_lora", lora_id=lora_id)
            return True

        def shutdown(self):
            recorder.record("shutdown")

    class LoRARequest:
        def __init__(self, lora_name, lora_int_id, lora_path):
            self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path

    def cleanup_dist_env_and_memory(shutdown_ray=False):
        recorder.record("cleanup_dist_env_and_memory")

    _module(monkeypatch, "vllm", __path__=[])
    _module(monkeypatch, "vllm.engine", __path__=[])
    _module(monkeypatch, "vllm.engine.arg_utils", AsyncEngineArgs=AsyncEngineArgs)
    _module(monkeypatch, "vllm.sampling_params", SamplingParams=SamplingParams, RequestOutputKind=RequestOutputKind)
    _module(monkeypatch, "vllm.lora", __path__=[])
    _module(monkeypatch, "vllm.lora.request", LoRARequest=LoRARequest)
    _module(monkeypatch, "vllm.v1", __path__=[])
    _module(monkeypatch, "vllm.v1.engine", __path__=[])
    _module(monkeypatch, "vllm.v1.engine.async_llm", AsyncLLM=AsyncLLM)
    _module(monkeypatch, "vllm.distributed", __path__=[])
    _module(monkeypatch, "vllm.distributed.parallel_state", cleanup_dist_env_and_memory=cleanup_dist_env_and_memory)
    recorder.RequestOutputKind = RequestOutputKind
    return recorder


# ---- ExLlamaV3 -------------------------------------------------------------------------


def install_fake_exllamav3(monkeypatch) -> Recorder:
    recorder = Recorder()

    class CacheLayer_fp16:  # noqa: N801 - the real class names
        pass

    class CacheLayer_quant:  # noqa: N801
        pass

    class Config:
        eos_token_id_list = [2, 7]

        @classmethod
        def from_directory(cls, directory):
            recorder.record("Config.from_directory", directory=directory)
            return cls()

    class Model:
        @classmethod
        def from_config(cls, config):
            recorder.record("Model.from_config")
            return cls()

        def load(self, **kwargs):
            recorder.record("Model.load", **kwargs)
            if recorder.fail_load:
                raise RuntimeError(recorder.fail_load)

        def unload(self):
            recorder.record("Model.unload")

    class Cache:
        def __init__(self, model, **kwargs):
            recorder.record("Cache", **kwargs)

    class Ids(list):
        @property
        def shape(self):
            return (1, len(self))

    class Tokenizer:
        eos_token_id = 7

        @classmethod
        def from_config(cls, config):
            recorder.record("Tokenizer.from_config")
            return cls()

        def encode(self, text, add_bos=True, encode_special_tokens=False):
            recorder.record("Tokenizer.encode", add_bos=add_bos, encode_special_tokens=encode_special_tokens)
            return Ids(_prompt_ids(recorder, text))

    class ComboSampler:
        def __init__(self, **kwargs):
            recorder.record("ComboSampler", **kwargs)

    class Job:
        def __init__(self, **kwargs):
            recorder.record("Job", **{k: v for k, v in kwargs.items() if k not in ("input_ids", "sampler")})
            self.kwargs = kwargs

    class Generator:
        def __init__(self, **kwargs):
            recorder.record("Generator", **{k: type(v).__name__ for k, v in kwargs.items()})
            self.jobs: list = []

        def enqueue(self, job):
            recorder.record("Generator.enqueue")
            pieces = recorder.reply[: job.kwargs["max_new_tokens"]]
            length = len(recorder.reply) > job.kwargs["max_new_tokens"]
            results = [{"job": job, "stage": "started", "eos": False}]
            for index, piece in enumerate(pieces):
                result = {"job": job, "stage": "streaming", "text": piece, "eos": False}
                if index == len(pieces) - 1:
                    result.update(eos=True, eos_reason="max_new_tokens" if length else "stop_token", new_tokens=len(pieces))
                results.append(result)
            self.jobs.append((job, results))

        def num_remaining_jobs(self):
            return len(self.jobs)

        def iterate(self):
            time.sleep(recorder.step_seconds)
            if not self.jobs:
                return []
            job, results = self.jobs[0]
            result = results.pop(0)
            if not results:
                self.jobs.pop(0)
            return [result]

        def cancel(self, job):
            recorder.record("Generator.cancel")
            self.jobs = [(j, r) for j, r in self.jobs if j is not job]

    _module(
        monkeypatch,
        "exllamav3",
        Config=Config,
        Model=Model,
        Cache=Cache,
        CacheLayer_fp16=CacheLayer_fp16,
        CacheLayer_quant=CacheLayer_quant,
        Tokenizer=Tokenizer,
        Generator=Generator,
        Job=Job,
        ComboSampler=ComboSampler,
    )
    recorder.CacheLayer_fp16, recorder.CacheLayer_quant = CacheLayer_fp16, CacheLayer_quant
    return recorder


# ---- in an engine process ---------------------------------------------------------------------

FAKE_PACKAGES = os.path.join(os.path.dirname(__file__), "fake_packages")


class _ForGood:
    """What the installers need of pytest's monkeypatch, for a process that keeps the fake."""

    @staticmethod
    def setitem(mapping, key, value) -> None:
        mapping[key] = value


def install_for_engine_process(package: str) -> Recorder:
    """Install the fake of ``package`` in this process, recording to ``$LLMPOOL_FAKE_RECORDS``."""
    install = {"vllm": install_fake_vllm, "exllamav3": install_fake_exllamav3}[package]
    recorder = install(_ForGood)
    recorder.sink = os.environ["LLMPOOL_FAKE_RECORDS"]
    return recorder


def recorded_calls(path) -> list[tuple[str, dict]]:
    """The calls an engine process's recorder appended to ``path``."""
    if not os.path.exists(path):
        return []
    with open(path) as records:
        return [tuple(json.loads(line)) for line in records]


def fakes_in_engine_processes(monkeypatch, records) -> None:
    """Engine processes started from now on import the fakes and record their calls to ``records``."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [FAKE_PACKAGES, os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("LLMPOOL_FAKE_RECORDS", str(records))
