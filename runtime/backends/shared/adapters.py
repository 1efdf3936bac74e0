"""LoRA adapters declared on a base model (llama_cpp, llama_server, vllm, vllm_serve).

A definition's ``adapters`` maps an adapter's name to its file (a GGUF LoRA for the llama.cpp
engines, a PEFT folder for vLLM, in the forms of ``runtime.pool.model_files``), its default
``scale`` and its ``aliases``.  Each adapter is a model id of its own, ``<model>:<adapter>``
(``adapter_id``), resolved by the catalog's one name rule (``runtime.pool.catalog``); a request
for it runs on the loaded base with that adapter applied, so an adapter costs no load and no
swap.  What each backend does with the declaration:

- llama_cpp: every adapter is loaded with the base (``llama_adapter_lora_init``) and applied per
  batch (``runtime.backends.llama_cpp.adapters``);
- llama_server: ``--lora FILE`` per adapter, in the declared order (llama-server numbers them
  from 0), and ``--lora-init-without-apply`` (none applied at start); every request carries
  ``"lora": [{"id", "scale"}]`` naming each adapter, the requested one at its scale and the
  others at 0, the base's requests all at 0 (``server_lora``);
- vllm / vllm_serve: LoRA enabled for every declared adapter (``max_loras``), the kept ones
  loaded at start (``vllm_lora_arguments``, ``vllm_lora_args``: ``--lora-modules name=path``);
  the request names the adapter as its model.

``adapters_loaded`` (``ADAPTERS_LOADED``, a load override of llama_cpp, vllm and vllm_serve)
keeps some of them loaded; a request for another is 409 adapter_not_loaded (``require_loaded``).
An adapter's file size is charged to its base (``adapters_mib``): the kept ones'.
"""
from __future__ import annotations

import os
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from runtime.backends.shared.overrides import LoadOverride
from runtime.errors import AdapterNotLoaded, InvalidLoadRequest
from runtime.pool.model_files import locate_model_file

ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$"
AdapterName = Annotated[str, Field(pattern=ADAPTER_NAME_PATTERN)]
AdapterAlias = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}$")]
SEPARATOR = ":"


class AdapterDefinition(BaseModel):
    """One adapter of a base model."""

    model_config = ConfigDict(extra="forbid", strict=True)

    path: Annotated[str, Field(min_length=1)]
    # The adapter's weight on the base: llama.cpp's lora scale (0: the base's own answers).
    scale: float = Field(1.0, ge=-8, le=8)
    # More model ids for it (unique across the catalog, as a model's aliases; no patterns).
    aliases: list[AdapterAlias] = Field(default_factory=list)


Adapters = dict[AdapterName, AdapterDefinition]
# llama_cpp's, vllm's and vllm_serve's load override (reconfigurable): which declared adapters
# are loaded (null: all).
ADAPTERS_LOADED = LoadOverride(
    "adapters_loaded", list[AdapterName],
    {"kind": "string_list_or_null", "default": None, "null_means": "every declared adapter",
     "format": "adapter_names", "reconfigurable": True},
)


def adapters_field():
    """The ``adapters`` field of a definition that may declare them (empty: none)."""
    return Field(default_factory=dict)


def declared(definition_or_config: Any, every: bool = False) -> dict[str, dict]:
    """A definition's adapters as plain dicts, in declared order; {} for a backend that has none.
    Of an effective config (a dict): those its ``adapters_loaded`` keeps (null: all), or with
    ``every`` all of them, loaded or not."""
    if isinstance(definition_or_config, dict):
        raw = definition_or_config.get("adapters") or {}
        kept = None if every else definition_or_config.get("adapters_loaded")
    else:
        raw = getattr(definition_or_config, "adapters", None) or {}
        kept = None  # every declared adapter is a model id, loaded or not
    return {name: (a.model_dump() if isinstance(a, BaseModel) else dict(a))
            for name, a in raw.items() if kept is None or name in kept}


def undeclared_loaded(definition: Any, loaded: list[str] | None) -> str | None:
    """Why ``loaded`` (an ``adapters_loaded`` value) does not fit ``definition``: the names it
    does not declare; None when it fits."""
    unknown = [name for name in loaded or () if name not in declared(definition)]
    return f"adapters_loaded names adapters the model does not declare: {', '.join(unknown)}" if unknown else None


def refuse_undeclared_loaded(definition: Any) -> None:
    """ValueError (invalid_settings) for a definition whose own ``adapters_loaded`` names an
    adapter it does not declare."""
    problem = undeclared_loaded(definition, definition.adapters_loaded)
    if problem:
        raise ValueError(problem)


def check_loaded_names(definition: Any, loaded: list[str] | None) -> None:
    """The ``adapters_loaded`` override names declared adapters only (400 invalid_load_request)."""
    problem = undeclared_loaded(definition, loaded)
    if problem:
        raise InvalidLoadRequest(problem, param="adapters_loaded")


def require_loaded(adapter: str | None, loaded) -> None:
    """AdapterNotLoaded (409) for a request's adapter that is not among ``loaded`` (the names
    loaded now): one the ``adapters_loaded`` override leaves out."""
    if adapter is not None and adapter not in loaded:
        raise AdapterNotLoaded(f"the LoRA adapter {adapter!r} is not loaded (adapters_loaded leaves it out)",
                               param="model")


def refuse_adapters_without_generation(definition: Any, pooling_only: bool) -> None:
    """ValueError for adapters on a model that does not generate (``pooling_only``: a reranker, a
    vLLM pooling runner): an adapter serves generation only."""
    if pooling_only and declared(definition):
        raise ValueError("adapters serve generation; this model does not generate (rerank, or vLLM's pooling runner)")


def adapter_aliases(definition: Any) -> dict[str, list[str]]:
    """Each adapter's name -> its aliases: what a node's record says of a model's adapters."""
    return {name: list(a["aliases"]) for name, a in declared(definition).items()}


def adapter_id(model: str, adapter: str) -> str:
    """The model id an adapter is asked for by."""
    return f"{model}{SEPARATOR}{adapter}"


def adapter_paths(config: dict, base_dir: str, every: bool = False) -> dict[str, str]:
    """Each adapter's file or folder as located (``runtime.pool.model_files``), by name: those
    ``config`` keeps loaded, or with ``every`` all it declares."""
    return {name: locate_model_file(a["path"], base_dir) or a["path"]
            for name, a in declared(config, every).items()}


def adapters_mib(config: dict, base_dir: str) -> int:
    """What the adapters add to their base's memory: their files' sizes (a folder's files), MiB up."""
    total = 0
    for path in adapter_paths(config, base_dir).values():
        if os.path.isfile(path):
            total += os.path.getsize(path)
        elif os.path.isdir(path):
            total += sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)
    return int(-(-total // (1024 * 1024)))


def server_lora(config: dict, adapter: str | None) -> list[dict]:
    """llama-server's per-request ``lora`` field: every adapter by its index among ``--lora``,
    ``adapter`` at its scale and the others (all of them for the base: None) at 0.  Every one is
    named: llama-server gives an adapter a request leaves out its global scale, which
    ``--lora-init-without-apply`` leaves at 1 in the pinned build."""
    return [{"id": index, "scale": a["scale"] if name == adapter else 0.0}
            for index, (name, a) in enumerate(declared(config).items())]


def llama_server_lora_args(config: dict, base_dir: str) -> list[str]:
    """``--lora FILE`` per adapter and ``--lora-init-without-apply``; nothing without adapters."""
    paths = adapter_paths(config, base_dir)
    if not paths:
        return []
    return [arg for path in paths.values() for arg in ("--lora", path)] + ["--lora-init-without-apply"]


def vllm_lora_arguments(config: dict) -> dict[str, Any]:
    """The in-process engine's ``AsyncEngineArgs`` for the adapters: ``enable_lora``, ``max_loras``
    (every declared adapter at once, so one ``adapters_loaded`` leaves out fits when it is added
    back) and ``max_lora_rank`` where set; {} without adapters."""
    count = len(declared(config, every=True))
    if not count:
        return {}
    rank = config.get("vllm_max_lora_rank")
    return {"enable_lora": True, "max_loras": count, **({"max_lora_rank": rank} if rank is not None else {})}


def vllm_lora_args(config: dict, base_dir: str) -> list[str]:
    """``--enable-lora --lora-modules name=path ... --max-loras N --max-lora-rank R``: a module per
    adapter ``adapters_loaded`` keeps (no ``--lora-modules`` where it keeps none), ``N`` every
    declared one (``vllm_lora_arguments``), the rank where the definition sets
    ``vllm_max_lora_rank``; nothing without adapters."""
    count = len(declared(config, every=True))
    if not count:
        return []
    modules = adapter_paths(config, base_dir)
    rank = config.get("vllm_max_lora_rank")
    return [
        "--enable-lora",
        *(["--lora-modules", *(f"{name}={path}" for name, path in modules.items())] if modules else []),
        "--max-loras", str(count),
        *(["--max-lora-rank", str(rank)] if rank is not None else []),
    ]
