"""A model's VRAM figure for the admin API: measured when a load was, estimated otherwise."""
from __future__ import annotations

from typing import Any

from runtime.pool.catalog import CatalogEntry


class VramFigure:
    """The last observed load delta of a model, else its backend's estimate.

    The estimate is cached per catalog entry, load override and replica count, since
    backends read model files for it.  The observed delta survives unloads and is
    dropped when the model's definition changes.
    """

    def __init__(self) -> None:
        # (MiB, replica count) the last successful load took on the GPUs.
        self.observed: tuple[int, int] | None = None
        self._entry: CatalogEntry | None = None
        self._key: tuple | None = None
        self._estimate: tuple[int | None, int, str] = (None, 0, "unavailable")

    def observe(self, mib: int | None, replicas: int) -> None:
        if mib is not None:
            self.observed = (mib, replicas)

    def forget(self) -> None:
        self.observed = None

    def value(self, entry: CatalogEntry, overrides: dict[str, Any], replicas: int) -> tuple[int | None, int, str]:
        """(MiB, replica count it is for, source)."""
        if self.observed is not None:
            mib, count = self.observed
            return mib, count, "observed_load_delta"
        key = (repr(sorted(overrides.items())), replicas)
        if self._entry is not entry or self._key != key:
            spec, definition = entry.spec, entry.definition
            config = spec.effective_config(definition, overrides)
            mib, source = spec.vram_estimate(definition, config, replicas, entry.base_dir)
            self._entry, self._key = entry, key
            self._estimate = (mib, replicas, source)
        return self._estimate
