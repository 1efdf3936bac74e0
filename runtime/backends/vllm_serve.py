"""vllm_serve: a managed local ``vllm serve`` subprocess, one per replica.

Same vLLM fields and load overrides as ``vllm``, plus how to start the
server.  ``target_inflight`` becomes ``--max-num-seqs``, so the extra args may
not set it.  The subprocess engine lands with the vllm_serve issue.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from runtime.backends.common_fields import (
    GEMMA4,
    NonEmptyStr,
    Port,
    artifact_estimate,
    check_extra_args,
    require_model_target,
    thinking_for_families,
)
from runtime.backends.vllm import VllmFields, VllmSpec


class VllmServeDefinition(VllmFields):
    backend: Literal["vllm_serve"]
    vllm_serve_binary: NonEmptyStr = "vllm"
    # Hub id or local path passed to `vllm serve`; model_path is used when this is null.
    vllm_serve_model: NonEmptyStr | None = None
    vllm_serve_host: NonEmptyStr = "127.0.0.1"
    vllm_serve_port: Port | None = None  # null: a free port per replica
    vllm_serve_api_key: str | None = None
    vllm_serve_env: dict[str, str] = Field(default_factory=dict)
    vllm_serve_library_path: str | None = None
    vllm_serve_extra_args: list[str] = Field(default_factory=list)
    vllm_serve_startup_timeout_seconds: float = Field(900.0, gt=0)

    @model_validator(mode="after")
    def _serve_rules(self):
        require_model_target(self, "vllm_serve_model")
        check_extra_args("vllm_serve_extra_args", self.vllm_serve_extra_args, ("--max-num-seqs",), "target_inflight")
        return self


class VllmServeSpec(VllmSpec):
    name = "vllm_serve"
    definition_model = VllmServeDefinition
    concurrent = True

    def thinking_modes(self, definition):
        return thinking_for_families(definition, (GEMMA4,))

    def response_formats(self, definition):
        return ["text", "json_schema"]

    def vram_estimate(self, definition, config, replicas, base_dir):
        return artifact_estimate(base_dir, replicas, definition.model_path, definition.vllm_serve_model)
