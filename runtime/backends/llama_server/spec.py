"""llama_server: a managed native ``llama-server`` subprocess, one per replica.

``target_inflight`` becomes ``--parallel`` (the slots share
``llama_server_n_ctx``, passed as ``-c``), so the extra args may not set it.
Every other definition field and load override maps to one llama-server flag
(``llama_server_command``); the extra args come last.  ``model_path``,
``llama_server_mmproj`` and ``llama_server_draft_model`` take the forms of
``runtime.pool.model_files`` (absolute, relative to the settings file, ``package:``).
``embeddings: true`` adds ``--embeddings`` (and ``--pooling`` where the GGUF declares none);
such a server still serves chat completions (llama-server switches per batch).  ``rerank: true``
adds ``--reranking`` (rank pooling; not with ``embeddings``).
``llama_server_tools`` (default true) passes ``--jinja``: llama-server renders the tools
through the GGUF's Jinja chat template and parses the model's calls itself (its generic JSON
format, grammar-constrained, for a template that names no tools).  llama-server reads a named
function as tool_choice as "auto", so such a request gets that function alone with "required"
(``LLAMA_SERVER.named_tool_choice``).

Restart-mode reconfigure (runtime.model.residency): ``llama_server_n_ctx``, ``llama_server_type_k``,
``llama_server_type_v`` and ``llama_server_flash_attn`` carry ``"reconfigurable": true,
"reconfigure_mode": "restart"``: POST .../reconfigure stops each replica's server and starts it
with the new arguments (the GGUF is read again, from the page cache), the model ``loaded``
throughout; a server that does not come up with them is started again with the old ones and
the call answers 400 invalid_load_request (``ManagedServerEngine.reconfigure``).
"""
from __future__ import annotations

import os
from typing import Annotated, Any, Literal

import httpx
from pydantic import Field, model_validator

import runtime.backends.shared.managed as managed
import runtime.backends.shared.server_spec as server_spec
from runtime.backends.shared.adapters import (
    Adapters,
    adapters_field,
    llama_server_lora_args,
    refuse_adapters_without_generation,
    server_lora,
)
from runtime.backends.shared.common_fields import FamilyDefinition, refuse_embeddings_with_rerank
from runtime.backends.llama_cpp.spec import (
    GgmlCacheType,
    cache_type_constraint,
    gguf_estimate_parts,
    gguf_file,
    layers_on_gpu,
)
from runtime.backends.llama_server.slots import SLOT_CALL_SECONDS, SlotStore
from runtime.backends.llama_server.speculative import SPEC_TYPES, spec_problem, spec_args
from runtime.backends.shared.overrides import (
    LoadOverride,
    PositiveInt,
    fields_fit,
    integer_override,
    refuse_problem,
)
from runtime.pool.gguf_info import GgufError, read_gguf_info
from runtime.pool.model_files import ModelFileError, locate_model_file, resolve_model_file


class LlamaServerDefinition(
    server_spec.server_fields(
        FamilyDefinition,
        "llama_server",
        binary="llama-server",
        startup_timeout_seconds=300.0,
        owned_flags={
            "target_inflight": ("--parallel", "-np"),
            "adapters": ("--lora", "--lora-scaled", "--lora-init-without-apply"),
        },
        # No llama_server_model: model_path is the GGUF file.
        fields=("binary", "host", "port", "api_key", "library_path", "env", "extra_args", "startup_timeout_seconds"),
    )
):
    llama_server_mmproj: str | None = None
    llama_server_draft_model: str | None = None
    # null leaves llama-server's default; an integer or "auto" / "all" is passed to --n-gpu-layers.
    llama_server_n_gpu_layers: Annotated[int, Field(ge=0)] | Literal["auto", "all"] | None = None
    llama_server_flash_attn: Literal["on", "off", "auto"] = "auto"
    llama_server_reasoning_format: Literal["auto", "none", "deepseek", "deepseek-legacy"] | None = None
    # --reasoning-budget: -1 unlimited, 0 disables thinking.
    llama_server_reasoning_budget: int | None = Field(None, ge=-1)
    # Shared by all parallel slots: each request gets about n_ctx / target_inflight.
    llama_server_n_ctx: int = Field(4096, ge=1)
    # --cache-type-k / --cache-type-v: null leaves llama-server's default (f16); a quantized V
    # cache needs flash attention (llama-server refuses to start otherwise).
    llama_server_type_k: GgmlCacheType | None = None
    llama_server_type_v: GgmlCacheType | None = None
    llama_server_image_max_tokens: int | None = Field(None, ge=1)
    # Speculative decoding (runtime.backends.llama_server.speculative: which knob maps to which
    # flag of each mode); null leaves it off.
    llama_server_spec_type: Literal[SPEC_TYPES] | None = None
    llama_server_spec_draft_n_max: int | None = Field(None, ge=1, le=6)
    llama_server_spec_ngram_n_max: int | None = Field(None, ge=1, le=1024)
    llama_server_spec_draft_n_min: int | None = Field(None, ge=0, le=1024)
    llama_server_spec_draft_p_min: float | None = Field(None, ge=0, le=1)
    llama_server_spec_ngram_size_n: int | None = Field(None, ge=1, le=1024)
    llama_server_spec_ngram_min_hits: int | None = Field(None, ge=1)
    # POST /v1/embeddings too: started with --embeddings (see llama_server_command for --pooling).
    embeddings: bool = False
    # POST /v1/audio/transcriptions and translations: the server serves them (an audio model) and
    # the request is passed through to it (runtime.backends.shared.openai_audio).
    audio_transcription: bool = False
    # POST /v1/rerank: started with --reranking (a reranker GGUF, rank pooling); the request goes to
    # llama-server's /v1/rerank.
    rerank: bool = False
    # Tool calling: started with --jinja (the default of recent builds, explicit for older ones);
    # false: capabilities.tools is false (the server is not asked for calls).
    llama_server_tools: bool = True
    # A request the client does not stream goes to llama-server unstreamed when its answer is held
    # to at most this many tokens (max_tokens): faster (one write, a kept-alive connection), and an
    # abandoned one holds its slot at most that long; a longer or unbounded one is streamed all the
    # same (LLAMA_SERVER.stream_always).  0: every call is streamed.
    llama_server_unstreamed_max_tokens: int = Field(16, ge=0)
    # LoRA adapters (GGUF), each a model id <model>:<adapter>: --lora per adapter, applied per
    # request through its "lora" field (runtime.backends.shared.adapters).
    adapters: Adapters = adapters_field()

    @model_validator(mode="after")
    def _one_pooling(self):
        refuse_embeddings_with_rerank(self)
        refuse_adapters_without_generation(self, self.rerank)
        # llama-server splits --lora's value at commas (several adapters in one flag).
        if any("," in adapter.path for adapter in self.adapters.values()):
            raise ValueError("a llama_server adapter's path may not contain a comma")
        return self

    _speculative_fields_fit = model_validator(mode="after")(fields_fit(spec_problem))


def llama_server_command(config: dict[str, Any], host: str, port: int, base_dir: str,
                         slot_save_path: str | None = None) -> list[str]:
    """The exact llama-server argv for one replica of ``config`` (the effective definition), with
    ``--slot-save-path`` where its slots are saved (``runtime.backends.llama_server.slots``)."""

    def local(field: str) -> str | None:
        return locate_model_file(config[field], base_dir)

    options = [
        "--parallel", str(config["target_inflight"]),
        "-c", str(config["llama_server_n_ctx"]),
        "--flash-attn", config["llama_server_flash_attn"],
        *(["--jinja"] if config["llama_server_tools"] else []),
        *server_spec.named_flags(config, "llama_server", "n_gpu_layers"),
        *server_spec.flag_args(
            ("--cache-type-k", config["llama_server_type_k"]),
            ("--cache-type-v", config["llama_server_type_v"]),
            ("--mmproj", local("llama_server_mmproj")),
            ("--spec-draft-model", local("llama_server_draft_model")),
        ),
        *server_spec.named_flags(config, "llama_server", "reasoning_format", "reasoning_budget", "image_max_tokens"),
        *spec_args(config),
        *server_spec.named_flags(config, "llama_server", "api_key"),
        *server_spec.flag_args(("--slot-save-path", slot_save_path)),
        *(_embedding_args(local("model_path")) if config["embeddings"] else []),
        *(["--reranking"] if config["rerank"] else []),
        *llama_server_lora_args(config, base_dir),
    ]
    return server_spec.server_argv(config, "llama_server", host, port, ["--model", local("model_path")], options)


def _embedding_args(model_file: str | None) -> list[str]:
    """``--embeddings``, and ``--pooling mean`` for a GGUF that declares no pooling of its own
    (a generative model: llama-server would pool nothing, which its /v1/embeddings refuses), so
    the vectors are pooled as the llama_cpp backend pools them (``GgufInfo.embedding_pooling``).
    A file that cannot be read as GGUF gets no --pooling: llama-server reports it at start."""
    try:
        info = read_gguf_info(model_file) if model_file else None
    except (OSError, GgufError):
        info = None
    if info is None or info.pooling_type == info.embedding_pooling:
        return ["--embeddings"]
    return ["--embeddings", "--pooling", info.embedding_pooling]


def _launch(config: dict[str, Any], site: managed.LaunchSite) -> managed.ServerLaunch:
    """The command, once the model files it names are known to be readable (ModelFileError otherwise)."""
    resolve_model_file(config["model_path"], site.base_dir)
    for field in ("llama_server_mmproj", "llama_server_draft_model"):
        if config[field] is not None:
            try:
                resolve_model_file(config[field], site.base_dir)
            except ModelFileError as exc:
                raise ModelFileError(f"{field}: {exc}") from None
    return managed.ServerLaunch(llama_server_command(config, site.host, site.port, site.base_dir, site.slot_save_path))


LLAMA_SERVER = managed.ServerProfile(
    program="llama-server",
    prefix="llama_server",
    build=_launch,
    served_model=lambda config, base_dir: os.path.basename(config["model_path"]),
    adapter_request=lambda config, served, adapter: (served, {"lora": server_lora(config, adapter)}),
    # llama-server checks for a closed connection before each chunk of a stream, but for an answer
    # it does not stream only after a whole second in which none of its tasks answered anything: a
    # busy server (other slots streaming, /slots or /metrics polls) finishes an abandoned one,
    # holding its slot.  So every call is streamed, pass-through ones too (forwarding.forward),
    # except one whose answer is held to llama_server_unstreamed_max_tokens at most.
    stream_always=True,
    unstreamed_max_tokens_field="llama_server_unstreamed_max_tokens",
    named_tool_choice=False,
    repeat_penalty_field="repeat_penalty",
)


# The conversations routing takes a llama-server replica's prompt cache to keep besides its slots'.
PROMPT_CACHE_SEQUENCES = 16

# The constraint keys of a field POST .../reconfigure changes by restarting the server.
RESTART = {"reconfigurable": True, "reconfigure_mode": "restart"}


class LlamaServerEngine(managed.ManagedServerEngine):
    """A llama-server replica that can be reconfigured by a restart with new arguments, and whose
    slots are saved before its server stops and restored when it starts again (``SlotStore``)."""

    def __init__(self, profile, model_name, config, replica_index, context):
        super().__init__(profile, model_name, config, replica_index, context)
        self._save_slots_of(config)

    async def load(self) -> None:
        await super().load()
        if self.slots is not None:
            async with self._slot_client() as client:
                await self.slots.restore(client, self.config["target_inflight"])

    async def unload(self) -> None:
        """Save the slots while the server still runs (not after it failed), then stop it."""
        running = self.process is not None and self.process.running
        if self.slots is not None and running and self._loaded and self._failure is None and not self._stopping:
            async with self._slot_client() as client:
                await self.slots.save(client)
        await super().unload()

    async def restart(self, config: dict[str, Any]) -> None:
        """``ManagedServerEngine.restart``, the slots saved under ``config``'s identity from now on."""
        self._save_slots_of(config)
        await super().restart(config)

    def _save_slots_of(self, config: dict[str, Any]) -> None:
        self.slots = SlotStore.for_replica(config, self.context)
        self.slot_save_path = self.slots.save_path() if self.slots is not None else None

    def _slot_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base_url, headers=self._auth, timeout=SLOT_CALL_SECONDS)


class LlamaServerSpec(server_spec.ManagedServerSpec):
    profile = LLAMA_SERVER
    definition_model = LlamaServerDefinition
    tools_field = "llama_server_tools"
    overrides = (
        # RESTART: POST .../reconfigure changes it while loaded, by restarting the server.
        integer_override("llama_server_n_ctx", **RESTART),
        integer_override("llama_server_image_max_tokens"),
        LoadOverride(
            "llama_server_spec_type",
            str,
            # The contract's constraint, its allowed values extended to every mode (additive).
            {"kind": "enum", "default": "draft-mtp", "allowed_values": list(SPEC_TYPES), "examples": ["draft-mtp"]},
        ),
        LoadOverride(
            "llama_server_spec_draft_n_max",
            PositiveInt,
            {"kind": "integer", "minimum": 1, "maximum": 6, "step": 1, "default": 2},
        ),
        LoadOverride(
            "llama_server_spec_ngram_n_max",
            PositiveInt,
            {"kind": "integer", "minimum": 1, "maximum": 1024, "step": 1},
        ),
        LoadOverride(
            "llama_server_spec_draft_n_min",
            Annotated[int, Field(ge=0, le=1024)],
            {"kind": "integer", "minimum": 0, "maximum": 1024, "step": 1, "default": 0},
        ),
        LoadOverride(
            "llama_server_spec_draft_p_min", float, {"kind": "float", "minimum": 0.0, "maximum": 1.0, "default": 0.0}
        ),
        LoadOverride(
            "llama_server_spec_ngram_size_n",
            PositiveInt,
            {"kind": "integer", "minimum": 1, "maximum": 1024, "step": 1, "default": 12},
        ),
        integer_override("llama_server_spec_ngram_min_hits", default=1),
        # Not in the contract's list: the rest of the reconfigurable server flags.
        LoadOverride("llama_server_type_k", str, cache_type_constraint(**RESTART)),
        LoadOverride("llama_server_type_v", str, cache_type_constraint(**RESTART)),
        LoadOverride(
            "llama_server_flash_attn",
            str,
            {"kind": "enum", "default": "auto", "allowed_values": ["on", "off", "auto"],
             "examples": ["auto", "on", "off"], **RESTART},
        ),
    )

    def check_override_combination(self, definition, overrides):
        """The speculative fields of the definition with ``overrides`` applied must fit together
        (``spec_problem``)."""
        refuse_problem(spec_problem(self.effective_config(definition, overrides)))

    def prefix_cache_sequences(self, target_inflight):
        """Its slots' conversations, and the prompts its host-memory prompt cache (``--cache-ram``,
        8 GiB by default) keeps of conversations that left a slot: taken as
        ``PROMPT_CACHE_SEQUENCES`` more."""
        return target_inflight + PROMPT_CACHE_SEQUENCES

    def context_length(self, config):
        """What one request gets: the slots share ``-c``."""
        return config["llama_server_n_ctx"] // max(1, config["target_inflight"])

    def default_device(self, definition):
        """No layers offloaded (``llama_server_n_gpu_layers: 0``): the model lives in RAM."""
        return "cpu" if definition.llama_server_n_gpu_layers == 0 else "auto"

    def estimate_parts(self, definition, config, base_dir):
        """One replica, one server process (``gguf_estimate_parts``): the GGUF, its KV cache at
        ``llama_server_n_ctx`` (the total its ``--parallel`` slots share) and cache types, the
        compute margin, and the process's GPU overhead, or on ``cpu`` (no GPU layers, or placed
        there) its vocabulary.  A missing file or one that is not GGUF: None (the file's size,
        ``vram_estimate``, counts then)."""
        found = gguf_file(config["model_path"], base_dir)
        if found is None:
            return None
        on_gpu = layers_on_gpu(config["llama_server_n_gpu_layers"], config.get("device"))
        return gguf_estimate_parts(
            *found, config["llama_server_n_ctx"], config["llama_server_type_k"], config["llama_server_type_v"],
            on_gpu=on_gpu,
        )

    def create_engine(self, model_name, config, replica_index, context):
        return LlamaServerEngine(self.profile, model_name, config, replica_index, context)
