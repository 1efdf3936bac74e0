"""openai_remote: a model served by a remote OpenAI-compatible API.

Nothing is loaded locally: there are no load overrides and no VRAM estimate.
Whether the model takes request-level thinking and file inputs is configured,
because the remote cannot be asked.  The client is
``runtime.backends.openai_remote.engine``; requests to the model are refused
with 403 remote_execution_disallowed unless ``service.allow_remote_execution``.
Tools always pass: the remote judges them (``capabilities.tools`` true, every tool_choice).
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from runtime.backends.base import SAMPLING_OPTIONS, THINKING_ALL, THINKING_DEFAULT_ONLY, BackendSpec
from runtime.backends.shared.common_fields import FamilyDefinition, NonEmptyStr, refuse_engine_process
from runtime.backends.openai_remote.engine import OpenaiRemoteEngine
from runtime.redaction import SECRET


class OpenaiRemoteDefinition(FamilyDefinition):
    backend: Literal["openai_remote"]
    remote_base_url: NonEmptyStr  # e.g. https://api.openai.com/v1
    remote_model: NonEmptyStr
    remote_api_key: str | None = Field(None, json_schema_extra=SECRET)
    # Name of an environment variable that holds the key, so it stays out of the settings files.
    remote_api_key_env: NonEmptyStr | None = None
    remote_timeout_seconds: float = Field(120.0, gt=0)
    # How file content items reach the remote; null: the model takes no file inputs.
    remote_file_mode: Literal["inline", "upload"] | None = None
    # Sent with every request; their values are redacted like the key (they often carry one).
    remote_headers: dict[str, str] = Field(default_factory=dict, json_schema_extra=SECRET)
    # Whether the remote honours per-request thinking control.
    remote_thinking: bool = False
    # Whether the remote model computes embeddings (POST /v1/embeddings goes to <remote_base_url>/embeddings).
    embeddings: bool = False
    # Whether the remote reranks (POST /v1/rerank goes to <remote_base_url>/rerank, the Jina / Cohere shape).
    rerank: bool = False

    @field_validator("remote_base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("remote_base_url must start with http:// or https://")
        return value

    @model_validator(mode="after")
    def _one_key_source(self):
        if self.remote_api_key is not None and self.remote_api_key_env is not None:
            raise ValueError("set remote_api_key or remote_api_key_env, not both")
        return self

    @model_validator(mode="after")
    def _nothing_to_isolate(self):
        refuse_engine_process(self, "its model runs on the remote server")
        return self


class OpenaiRemoteSpec(BackendSpec):
    name = "openai_remote"
    definition_model = OpenaiRemoteDefinition
    concurrent = True

    def thinking_modes(self, definition):
        return list(THINKING_ALL) if definition.remote_thinking else list(THINKING_DEFAULT_ONLY)

    def file_inputs(self, definition):
        return definition.remote_file_mode is not None

    def is_remote(self, definition):
        return True

    def embedding_dimensions(self, definition):
        """The remote judges ``dimensions``."""
        return True

    def forwards_requests(self, definition):
        return True

    def sampling_options(self, definition):
        """OpenAI's own: seed, the penalties and logprobs.  OpenAI's API has no top_k or
        repeat_penalty, so a typed request (/v1/responses, /v1/messages, Ollama's) that sets one
        is refused; a chat body forwarded as it is carries what its client wrote."""
        return [option for option in SAMPLING_OPTIONS if option not in ("top_k", "repeat_penalty")]

    def tools(self, definition):
        """The remote judges tools and tool_choice (a model without them answers its own 400)."""
        return True

    def create_engine(self, model_name, config, replica_index, context):
        return OpenaiRemoteEngine(model_name, config)
