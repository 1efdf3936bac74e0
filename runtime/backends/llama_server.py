"""llama_server: a managed native ``llama-server`` subprocess, one per replica.

``target_inflight`` becomes ``--parallel`` (the slots share
``llama_server_n_ctx``), so the extra args may not set it.  The subprocess
engine lands with the llama_server issue.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from runtime.backends.base import BackendSpec
from runtime.backends.common_fields import (
    FamilyDefinition,
    NonEmptyStr,
    Port,
    artifact_estimate,
    check_extra_args,
    require_model_target,
)


class LlamaServerDefinition(FamilyDefinition):
    backend: Literal["llama_server"]
    llama_server_binary: NonEmptyStr = "llama-server"
    llama_server_host: NonEmptyStr = "127.0.0.1"
    llama_server_port: Port | None = None  # null: a free port per replica
    llama_server_api_key: str | None = None
    llama_server_library_path: str | None = None
    llama_server_env: dict[str, str] = Field(default_factory=dict)
    llama_server_extra_args: list[str] = Field(default_factory=list)
    llama_server_startup_timeout_seconds: float = Field(300.0, gt=0)
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
    llama_server_image_max_tokens: int | None = Field(None, ge=1)
    llama_server_spec_type: Literal["draft-mtp"] | None = None
    llama_server_spec_draft_n_max: int | None = Field(None, ge=1, le=6)
    llama_server_spec_draft_p_min: float | None = Field(None, ge=0, le=1)

    @model_validator(mode="after")
    def _server_rules(self):
        require_model_target(self)
        check_extra_args(
            "llama_server_extra_args", self.llama_server_extra_args, ("--parallel", "-np"), "target_inflight"
        )
        return self


class LlamaServerSpec(BackendSpec):
    name = "llama_server"
    definition_model = LlamaServerDefinition
    concurrent = True
    override_fields = (
        "llama_server_n_ctx",
        "llama_server_image_max_tokens",
        "llama_server_spec_type",
        "llama_server_spec_draft_n_max",
        "llama_server_spec_draft_p_min",
    )

    def backend_constraints(self, definition):
        return {
            "llama_server_n_ctx": {"kind": "integer", "minimum": 1, "step": 1},
            "llama_server_image_max_tokens": {"kind": "integer", "minimum": 1, "step": 1},
            "llama_server_spec_type": {
                "kind": "enum",
                "default": "draft-mtp",
                "allowed_values": ["draft-mtp"],
                "examples": ["draft-mtp"],
            },
            "llama_server_spec_draft_n_max": {"kind": "integer", "minimum": 1, "maximum": 6, "step": 1, "default": 2},
            "llama_server_spec_draft_p_min": {"kind": "float", "minimum": 0.0, "maximum": 1.0, "default": 0.0},
        }

    def vram_estimate(self, definition, config, replicas, base_dir):
        return artifact_estimate(base_dir, replicas, definition.model_path)
