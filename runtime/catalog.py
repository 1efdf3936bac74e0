"""The catalog: configured models from the merged settings, keyed by public name."""
from __future__ import annotations

from dataclasses import dataclass

from runtime.backends import BACKENDS, BackendSpec
from runtime.backends.base import CommonDefinition
from runtime.config import LoadedSettings
from runtime.redaction import redacted_dump


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    definition: CommonDefinition
    sources: tuple[str, ...]
    base_dir: str

    @property
    def spec(self) -> BackendSpec:
        return BACKENDS[self.definition.backend]

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
        )
        for name, definition in loaded.settings.models.items()
    }
