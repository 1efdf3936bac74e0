"""The spec side of the managed-server backends: the shape of a server's command line, the
``<prefix>_*`` definition fields every such backend has, and ``ManagedServerSpec``, the spec of a
backend keyed by its ``ServerProfile`` (whose engine, ``ManagedServerEngine``, is in
``runtime.backends.shared.managed``).
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, create_model, model_validator

from runtime.backends.base import BackendSpec, CommonDefinition
from runtime.backends.shared.common_fields import (
    NonEmptyStr,
    Port,
    artifact_estimate,
    check_extra_args,
    refuse_engine_process,
    require_model_target,
    thinking_for_families,
)
from runtime.backends.shared.managed import ManagedServerEngine, ServerProfile
from runtime.redaction import SECRET, SECRET_FLAG_VALUES


def flag_args(*pairs: tuple[str, Any]) -> list[str]:
    """``[flag, value, ...]`` for every pair whose value is not None."""
    args: list[str] = []
    for flag, value in pairs:
        if value is not None:
            args += [flag, str(value)]
    return args


def named_flags(config: dict[str, Any], prefix: str, *names: str) -> list[str]:
    """``flag_args`` of the fields ``<prefix>_<name>`` whose flag is their name (``--max-model-len``
    for ``max_model_len``), as the servers' command lines are derived from their own settings."""
    return flag_args(*((f"--{name.replace('_', '-')}", config[f"{prefix}_{name}"]) for name in names))


def server_argv(
    config: dict[str, Any], prefix: str, host: str, port: int, model_args: list[str], args: list[str]
) -> list[str]:
    """``<binary> <model_args> --host <host> --port <port> <args> <extra args>``, the shape of
    every managed server's command; the operator's ``<prefix>_extra_args`` come last."""
    return [
        config[f"{prefix}_binary"],
        *model_args,
        "--host", host,
        "--port", str(port),
        *args,
        *config[f"{prefix}_extra_args"],
    ]


# ---- the spec ----------------------------------------------------------------------------

# The fields ``server_fields`` can declare, without their prefix, in their usual order.
SERVER_FIELDS = (
    "binary", "model", "host", "port", "api_key", "env", "library_path", "extra_args", "startup_timeout_seconds"
)


def server_fields(
    base: type[CommonDefinition],
    prefix: str,
    *,
    binary: str,
    startup_timeout_seconds: float,
    owned_flags: dict[str, tuple[str, ...]],
    fields: tuple[str, ...] = SERVER_FIELDS,
) -> type[CommonDefinition]:
    """``base`` with ``backend: Literal[prefix]`` and the ``<prefix>_*`` fields of a managed server.

    ``fields`` names which of them the definition has, in the order it declares them:
    ``binary`` (default ``binary``), ``model`` (the hub id or local path the server loads;
    null: model_path), ``host`` (127.0.0.1), ``port`` (null: a free port per replica),
    ``api_key``, ``env``, ``library_path``, ``extra_args`` and ``startup_timeout_seconds``
    (default ``startup_timeout_seconds``).  ``api_key`` and ``env`` hold secrets, and so may the
    values of secret flags in ``extra_args``: they are marked so (runtime.redaction).  A
    definition is valid when model_path (or ``<prefix>_model``) names the model and the extra
    args set none of the ``owned_flags`` (``{owner: flags}``: the field that sets those flags
    itself), and ``isolation`` is not ``"process"`` (the server is a process of its own already).
    """
    declarations = {
        "binary": (NonEmptyStr, binary),
        "model": (NonEmptyStr | None, None),
        "host": (NonEmptyStr, "127.0.0.1"),
        "port": (Port | None, None),
        "api_key": (str | None, Field(None, json_schema_extra=SECRET)),
        "env": (dict[str, str], Field(default_factory=dict, json_schema_extra=SECRET)),
        "library_path": (str | None, None),
        "extra_args": (list[str], Field(default_factory=list, json_schema_extra=SECRET_FLAG_VALUES)),
        "startup_timeout_seconds": (float, Field(startup_timeout_seconds, gt=0)),
    }
    target_field = f"{prefix}_model" if "model" in fields else None
    extra_args_field = f"{prefix}_extra_args"

    def server_rules(definition):
        refuse_engine_process(definition, "each replica is a server process of its own already")
        require_model_target(definition, target_field)
        for owner, flags in owned_flags.items():
            check_extra_args(extra_args_field, getattr(definition, extra_args_field), flags, owner)
        return definition

    return create_model(
        "".join(word.capitalize() for word in prefix.split("_")) + "Fields",
        __base__=base,
        __validators__={"_server_rules": model_validator(mode="after")(server_rules)},
        backend=(Literal[prefix], ...),
        **{f"{prefix}_{name}": declarations[name] for name in fields},
    )


class ManagedServerSpec(BackendSpec):
    """A backend whose every replica is one server process, keyed by its ``profile``.

    It is named by the profile's prefix, runs many requests per replica
    (``target_inflight``), takes json_schema where the profile forwards it, and
    estimates VRAM from the first local model artifact: model_path, then
    ``<prefix>_model``.
    """

    profile: ClassVar[ServerProfile]
    concurrent = True
    # prompt_format families whose thinking switch the server's chat template honours.
    thinking_families: ClassVar[tuple[str, ...]] = ()
    # The definition field that starts the server for tool calling (a switch, or the parser's
    # name: set means on); capabilities.tools follows it.
    tools_field: ClassVar[str]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.name = cls.profile.prefix

    def thinking_modes(self, definition):
        return thinking_for_families(definition, self.thinking_families)

    def forwards_requests(self, definition):
        return True

    def response_formats(self, definition):
        return ["text", "json_schema"] if self.profile.json_schema else ["text"]

    def tools(self, definition):
        """Whether the server was started for tool calling (``tools_field`` set): it renders the
        tools and parses its model's calls; every tool_choice then (base ``tool_choices``)."""
        return bool(getattr(definition, self.tools_field))

    def vram_estimate(self, definition, config, replicas, base_dir):
        target = getattr(definition, f"{self.name}_model", None)
        return artifact_estimate(base_dir, replicas, definition.model_path, target)

    def create_engine(self, model_name, config, replica_index, context):
        return ManagedServerEngine(self.profile, model_name, config, replica_index, context)
