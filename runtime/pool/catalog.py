"""The catalog: configured models from the merged settings, keyed by public name; and the one rule
that says which model a name given by a client means.

A model is asked for by its name or by one of its ``aliases``; an alias with ``*`` is a pattern
(``claude-*haiku*``) that stands for every name it matches, so an operator can land the dated
names a client asks for (Claude Code's) on a configured model.  A model's LoRA adapters
(``runtime.backends.shared.adapters``) are model ids of their own, ``<model>:<adapter>`` and the
adapter's aliases, which mean that adapter on its base: ``adapter_bases`` says which base and
adapter such an id is, ``base_of`` takes one apart.  ``model_names`` indexes names and
aliases, ``canonical_model`` resolves a name through that index.  Every place that needs the model a name
means uses the two: the runtime's lookup (``ModelPool.lookup``), the API's routing over the nodes'
records (``models_app.transport.nodes``) and its key check (``models_app.api.keys``), so the three
never disagree on what a name means.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from runtime.backends import BACKENDS, BackendSpec
from runtime.backends.base import CommonDefinition
from runtime.backends.shared.adapters import adapter_id
from runtime.config import LoadedSettings, RoutingSettings
from runtime.errors import RemoteExecutionDisallowed
from runtime.redaction import redacted_dump


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    definition: CommonDefinition
    sources: tuple[str, ...]
    base_dir: str
    # engine.kv_store of the settings, as its engines are handed it (runtime.model.replicas).
    kv_store: dict = field(default_factory=dict)
    # engine.routing of the settings, as its scheduler opens with it (runtime.model.routing).
    routing: RoutingSettings = field(default_factory=RoutingSettings)

    @property
    def spec(self) -> BackendSpec:
        return BACKENDS[self.definition.backend]

    def refuse_remote(self, allow_remote: bool) -> None:
        """403 for a model that runs on a remote service while service.allow_remote_execution is false."""
        if self.spec.is_remote(self.definition) and not allow_remote:
            raise RemoteExecutionDisallowed(
                f"model {self.name} runs on a remote service and service.allow_remote_execution is false"
            )

    def definition_dict(self) -> dict:
        """Common fields plus only the resolved backend's fields, secrets redacted: what every
        output shows (runtime.redaction).  The runtime itself reads ``definition``."""
        return redacted_dump(self.definition)

    def same_definition(self, other: CatalogEntry, *, ignore: frozenset[str] = frozenset()) -> bool:
        """Whether the definitions are equal but for ``ignore``, secrets compared by their real values."""
        mine = {k: v for k, v in self.definition.model_dump().items() if k not in ignore}
        theirs = {k: v for k, v in other.definition.model_dump().items() if k not in ignore}
        return mine == theirs


def build_catalog(loaded: LoadedSettings) -> dict[str, CatalogEntry]:
    return {
        name: CatalogEntry(
            name=name,
            definition=definition,
            sources=tuple(loaded.sources.get(name, ())),
            base_dir=loaded.base_dir,
            kv_store=loaded.settings.engine.kv_store.model_dump(),
            routing=loaded.settings.engine.routing,
        )
        for name, definition in loaded.settings.models.items()
    }


def model_names(
    models: Mapping[str, Iterable[str]], adapters: Mapping[str, Mapping[str, Iterable[str]]] | None = None
) -> dict[str, str]:
    """Each name a client may give a model, mapped to the model id it means: ``models`` maps a
    model's name to its aliases, ``adapters`` a model's name to its adapters and their aliases.
    A model's name means itself, each alias its model; an adapter's id (``<model>:<adapter>``)
    means itself, each of its aliases that id.  The settings keep every name unique
    (``runtime.config.alias_problems``); should two sources disagree all the same (two nodes'
    records read a moment apart), a model's name wins over an alias, and the first model to
    declare an alias keeps it."""
    names = {name: name for name in models}
    for name, aliases in models.items():
        for alias in aliases:
            names.setdefault(alias, name)
    for base, declared in (adapters or {}).items():
        for adapter, aliases in declared.items():
            model_id = adapter_id(base, adapter)
            names.setdefault(model_id, model_id)
            for alias in aliases:
                names.setdefault(alias, model_id)
    return names


def adapter_bases(adapters: Mapping[str, Iterable[str]]) -> dict[str, tuple[str, str]]:
    """Each adapter's model id -> (its base model, the adapter's name), for ``adapters`` mapping
    a model's name to its adapters' names."""
    return {adapter_id(base, adapter): (base, adapter) for base, names in adapters.items() for adapter in names}


def base_of(model_id: str, bases: Mapping[str, tuple[str, str]]) -> tuple[str, str | None]:
    """The model a model id (``canonical_model``'s answer) runs on and its adapter (None: the
    model itself), by ``bases`` (``adapter_bases``)."""
    return bases.get(model_id, (model_id, None))


def canonical_model(name: str, names: Mapping[str, str]) -> str | None:
    """The configured model ``name`` means, by ``names`` (``model_names``): a model's name is
    itself, an alias is its model; a name that is neither is the model of the first pattern alias
    (``*`` for any run of characters) it matches, in the settings' order; any other name None."""
    model = names.get(name)
    if model is not None:
        return model
    return next((model for alias, model in names.items() if is_pattern(alias) and fnmatchcase(name, alias)), None)


def is_pattern(alias: str) -> bool:
    """Whether an alias is a name pattern (holds ``*``) rather than one name."""
    return "*" in alias
