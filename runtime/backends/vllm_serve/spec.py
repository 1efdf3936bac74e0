"""vllm_serve: a managed local ``vllm serve`` subprocess, one per replica.

Same vLLM fields and load overrides as ``vllm``, plus how to start the
server.  ``target_inflight`` becomes ``--max-num-seqs``, so the extra args may
not set it.  The speculative fields become one ``--speculative-config`` JSON
and ``vllm_max_pixels`` is merged into ``--mm-processor-kwargs``, as the
in-process engine does (``runtime.backends.vllm.arguments``).  Only this
managed backend forwards a json_schema ``response_format``.
``vllm_tool_call_parser`` starts the server for tool calling:
``--enable-auto-tool-choice --tool-call-parser <parser>`` (the extra args may set neither);
without it vLLM refuses tools with the default tool_choice "auto".
``vllm_enable_sleep_mode`` starts the server with ``--enable-sleep-mode`` and
``VLLM_SERVER_DEV_MODE=1`` (vLLM registers its sleep endpoints only then): the model can
then sleep (runtime.model.residency): ``POST /sleep?level=1`` (the weights to host RAM, the KV
cache dropped, the GPU memory freed), ``POST /wake_up``, each checked by ``GET /is_sleeping``.

LoRA adapters: the server starts with a ``--lora-modules`` entry per adapter ``adapters_loaded``
keeps (runtime.backends.shared.adapters).  A reconfigure of ``adapters_loaded`` restarts the
server with the new list (``ManagedServerEngine.reconfigure``), unless ``vllm_runtime_lora``
allows vLLM's runtime LoRA loading (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` in its
environment): then each adapter added is ``POST /v1/load_lora_adapter {"lora_name",
"lora_path"}`` and each one dropped ``POST /v1/unload_lora_adapter {"lora_name"}``, the server
kept (``VllmServeEngine.swap_adapters``).
"""
from __future__ import annotations

import json
from typing import Any

import httpx
from pydantic import model_validator

import runtime.backends.shared.managed as managed
import runtime.backends.shared.server_spec as server_spec
from runtime.backends.shared.adapters import (
    adapter_paths,
    declared,
    refuse_adapters_without_generation,
    require_loaded,
    vllm_lora_args,
)
from runtime.backends.shared.common_fields import GEMMA4, NonEmptyStr
from runtime.backends.vllm import VllmFields, VllmSpec
from runtime.backends.vllm.arguments import mm_processor_kwargs, speculative_config
from runtime.errors import BackendError, InvalidLoadRequest


class VllmServeDefinition(
    server_spec.server_fields(
        VllmFields,
        "vllm_serve",
        binary="vllm",
        startup_timeout_seconds=900.0,
        owned_flags={
            "target_inflight": ("--max-num-seqs",),
            "vllm_tool_call_parser": ("--enable-auto-tool-choice", "--tool-call-parser"),
            "adapters": ("--enable-lora", "--lora-modules", "--max-loras", "--max-lora-rank"),
        },
    )
):
    # the vllm_* fields of VllmFields and the vllm_serve_* ones of server_fields, and:
    # POST /v1/embeddings: ``--runner pooling`` (a generative architecture is converted to an
    # embedding model, vLLM's ``--convert auto``); the server then serves embeddings only.
    embeddings: bool = False
    # POST /v1/audio/transcriptions and translations: the server serves them (an audio model) and
    # the request is passed through to it (runtime.backends.shared.openai_audio).
    audio_transcription: bool = False
    # POST /v1/rerank (a cross-encoder, *ForSequenceClassification): ``--runner pooling`` too; the
    # request goes to vLLM's own /v1/rerank.
    rerank: bool = False
    # Tool calling: the vLLM tool parser of the model's call format (hermes, llama3_json,
    # mistral, pythonic, qwen3_coder, ...: whatever this vLLM registers; it checks at start).
    vllm_tool_call_parser: NonEmptyStr | None = None
    # The warm tier: --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1, so POST .../sleep works.
    vllm_enable_sleep_mode: bool = False
    # The operator allows vLLM's runtime LoRA loading (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True): a
    # reconfigure of adapters_loaded loads and unloads adapters on the running server, no restart.
    vllm_runtime_lora: bool = False

    @model_validator(mode="after")
    def _generates_for_adapters(self):
        refuse_adapters_without_generation(self, self.embeddings or self.rerank)
        return self


def _json(value: dict | None) -> str | None:
    return json.dumps(value, separators=(",", ":")) if value else None


def vllm_serve_command(config: dict[str, Any], host: str, port: int, base_dir: str) -> list[str]:
    """The exact ``vllm serve`` argv for one replica of ``config`` (the effective definition)."""
    options = [
        "--max-num-seqs", str(config["target_inflight"]),
        "--tensor-parallel-size", str(config["vllm_tensor_parallel_size"]),
        "--dtype", config["vllm_dtype"],
        *server_spec.named_flags(config, "vllm", "max_model_len", "gpu_memory_utilization", "kv_cache_dtype",
                                 "kv_cache_memory_bytes", "quantization", "reasoning_parser"),
        *server_spec.flag_args(
            ("--mm-processor-kwargs", _json(mm_processor_kwargs(config))),
            ("--speculative-config", _json(speculative_config(config))),
        ),
        *server_spec.named_flags(config, "vllm_serve", "api_key"),
        *(["--enforce-eager"] if config["vllm_enforce_eager"] else []),
        *(["--trust-remote-code"] if config["vllm_trust_remote_code"] else []),
        *(["--runner", "pooling"] if config["embeddings"] or config["rerank"] else []),
        *(["--enable-sleep-mode"] if config["vllm_enable_sleep_mode"] else []),
        *_tool_args(config["vllm_tool_call_parser"]),
        *vllm_lora_args(config, base_dir),
    ]
    model_args = ["serve", managed.server_target(config, "vllm_serve", base_dir)]
    return server_spec.server_argv(config, "vllm_serve", host, port, model_args, options)


def _tool_args(parser: str | None) -> list[str]:
    return ["--enable-auto-tool-choice", "--tool-call-parser", parser] if parser else []


def _launch(config: dict[str, Any], site: managed.LaunchSite) -> managed.ServerLaunch:
    env = {}
    if config["vllm_enable_sleep_mode"]:  # vLLM serves /sleep, /wake_up and /is_sleeping only in its development mode
        env["VLLM_SERVER_DEV_MODE"] = "1"
    if config["vllm_runtime_lora"]:  # and /v1/load_lora_adapter, /v1/unload_lora_adapter only with this
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    return managed.ServerLaunch(vllm_serve_command(config, site.host, site.port, site.base_dir), env=env)


def _adapter_request(config: dict[str, Any], served: str, adapter: str | None) -> tuple[str, dict]:
    """vLLM serves each adapter it loaded under its own name; one ``adapters_loaded`` leaves out
    is 409 adapter_not_loaded."""
    require_loaded(adapter, declared(config))
    return adapter or served, {}


VLLM_SERVE = managed.ServerProfile(program="vllm serve", prefix="vllm_serve", build=_launch, json_schema=True,
                                   adapter_request=_adapter_request)
SLEEP_LEVEL = 1  # the weights kept in host RAM (level 2 would drop them: a wake could not serve)
CONTROL_TIMEOUT_SECONDS = 300.0  # a sleep copies the weights to host RAM, a wake back
# What a level-1 sleep leaves on the GPU, as a share of what the server held awake: vLLM's docs say
# it frees "up to 90%+" (the CUDA context and buffers stay).  Not measured here (no GPU in the tests).
SLEEP_RESIDUAL_SHARE = 0.10


# vLLM's runtime LoRA routes (vllm/entrypoints/serve/lora/api_router.py), and the call that undoes each.
LORA_ROUTES = {"load": "/v1/load_lora_adapter", "unload": "/v1/unload_lora_adapter"}
UNDO = {"load": "unload", "unload": "load"}


class LoraCallRefused(Exception):
    """The server answered a runtime LoRA call with an error."""


class VllmServeEngine(managed.ManagedServerEngine):
    """A ``vllm serve`` replica that can sleep when started with sleep mode, and load and unload
    adapters while it runs where ``vllm_runtime_lora`` allows it."""

    async def sleep(self) -> None:
        await self._sleep_call("/sleep", {"level": str(SLEEP_LEVEL)}, expect=True)

    async def wake(self) -> None:
        await self._sleep_call("/wake_up", None, expect=False)

    async def reconfigure(self, config: dict[str, Any]) -> None:
        """Take ``config``'s ``adapters_loaded`` (the one reconfigurable field of vllm_serve): on
        the running server where ``vllm_runtime_lora`` allows it (``swap_adapters``), else by a
        restart with the new ``--lora-modules``."""
        if config["vllm_runtime_lora"]:
            await self.swap_adapters(config)
        else:
            await super().reconfigure(config)

    async def swap_adapters(self, config: dict[str, Any]) -> None:
        """Load the adapters ``config`` adds, then unload those it drops, through vLLM's runtime
        LoRA routes.  A call the server refuses undoes the ones made before it and is 400
        invalid_load_request: the adapters stay as they were (BackendError where even the undoing
        is refused)."""
        base_dir = self.context["base_dir"]
        before, after = adapter_paths(self.config, base_dir), adapter_paths(config, base_dir)
        steps = [("load", name, path) for name, path in after.items() if name not in before]
        steps += [("unload", name, path) for name, path in before.items() if name not in after]
        done = []
        async with self._control_client() as client:
            try:
                for step in steps:
                    await self._lora_call(client, *step)
                    done.append(step)
            except LoraCallRefused as refused:
                for action, name, path in reversed(done):
                    try:
                        await self._lora_call(client, UNDO[action], name, path)
                    except LoraCallRefused as again:
                        raise BackendError(f"{self.label}: {refused}, and undoing it failed: {again}") from None
                raise InvalidLoadRequest(f"{self.label}: {refused}; the adapters stay as they were",
                                         param="adapters_loaded") from None
        self.config = config

    async def _lora_call(self, client: httpx.AsyncClient, action: str, name: str, path: str) -> None:
        body = {"lora_name": name, "lora_path": path} if action == "load" else {"lora_name": name}
        try:
            answer = await client.post(LORA_ROUTES[action], json=body)
        except httpx.TransportError as exc:
            raise await self._connection_lost(exc) from None
        if answer.status_code != 200:
            raise LoraCallRefused(f"POST {LORA_ROUTES[action]} for the adapter {name!r} answered "
                                  f"{answer.status_code}: {answer.text[:500]}")

    def _control_client(self) -> httpx.AsyncClient:
        """A client of its own for rare control calls (the pooled one is for requests)."""
        if self._client is None or self.base_url is None:
            raise BackendError(f"{self.label} is not loaded")
        timeout = httpx.Timeout(CONTROL_TIMEOUT_SECONDS, connect=10.0)
        return httpx.AsyncClient(base_url=self.base_url, headers=self._auth, timeout=timeout, trust_env=False)

    async def _sleep_call(self, path: str, params: dict | None, *, expect: bool) -> None:
        """POST ``path``, then GET /is_sleeping: BackendError unless it answers ``expect``."""
        try:
            async with self._control_client() as client:
                answer = await client.post(path, params=params)
                state = await client.get("/is_sleeping") if answer.status_code == 200 else None
        except httpx.TransportError as exc:
            raise await self._connection_lost(exc) from None
        if state is None:
            raise BackendError(f"{self.label} answered POST {path} with {answer.status_code}: {answer.text[:500]}")
        try:
            sleeping = state.json()["is_sleeping"] if state.status_code == 200 else None
        except (ValueError, KeyError, TypeError):
            sleeping = None
        if sleeping is not expect:
            raise BackendError(
                f"{self.label}: after POST {path}, GET /is_sleeping answered {state.status_code} {state.text[:200]!r} "
                f"(expected is_sleeping {str(expect).lower()})"
            )


class VllmServeSpec(server_spec.ManagedServerSpec, VllmSpec):
    """The vllm rules and load overrides, run by a managed ``vllm serve``."""

    profile = VLLM_SERVE
    definition_model = VllmServeDefinition
    thinking_families = (GEMMA4,)
    tools_field = "vllm_tool_call_parser"

    def embedding_dimensions(self, definition):
        """vLLM judges ``dimensions`` (a Matryoshka model takes it, any other refuses it)."""
        return True

    def can_sleep(self, definition):
        return definition.vllm_enable_sleep_mode

    def load_constraints(self, definition):
        """``adapters_loaded`` is reconfigured by a restart unless the definition allows vLLM's
        runtime LoRA loading (``vllm_runtime_lora``)."""
        constraints = super().load_constraints(definition)
        if not definition.vllm_runtime_lora:
            constraints["adapters_loaded"]["reconfigure_mode"] = "restart"
        return constraints

    def sleeping_mib(self, definition, config, base_dir, awake_mib):
        return int(awake_mib * SLEEP_RESIDUAL_SHARE) if definition.vllm_enable_sleep_mode else awake_mib

    def create_engine(self, model_name, config, replica_index, context):
        return VllmServeEngine(self.profile, model_name, config, replica_index, context)
