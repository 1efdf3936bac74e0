"""The pool: every configured model's controller, the settings they came from, and reload.

Reads (snapshots) go straight to the controllers.  A settings reload reads and
validates the files first, then checks conflicts and swaps the catalog in one
synchronous step on the event loop, so no controller step interleaves with it.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from runtime.catalog import CatalogEntry, build_catalog
from runtime.config import LoadedSettings, load_settings
from runtime.controller import ModelController
from runtime.errors import SettingsReloadConflict, UnknownModel
from runtime.state import ACTIVE_STATES, TransitionEvent

logger = logging.getLogger("llmpool.runtime")

# Changing only these definition fields never conflicts with an active model.
RELOAD_SAFE_FIELDS = frozenset({"enabled"})


class ModelPool:
    def __init__(self, settings_path: str, listeners: list[Callable[[TransitionEvent], None]] | None = None):
        self.settings_path = settings_path
        self.listeners = listeners if listeners is not None else []
        self.loaded: LoadedSettings | None = None
        self.startup_service = None
        self.controllers: dict[str, ModelController] = {}

    @property
    def settings(self):
        return self.loaded.settings

    async def start(self, *, load_enabled: bool = True) -> None:
        """Read the settings (raises InvalidSettings) and start loading enabled models in the background."""
        self.loaded = load_settings(self.settings_path)
        self.startup_service = self.loaded.settings.service.model_dump()
        for name, entry in build_catalog(self.loaded).items():
            self._add(entry)
        if load_enabled:
            for controller in self.controllers.values():
                if controller.entry.definition.enabled:
                    controller.begin_load()

    async def shutdown(self) -> None:
        await asyncio.gather(*(controller.stop() for controller in self.controllers.values()))
        self.controllers.clear()

    def controller(self, name: str) -> ModelController:
        try:
            return self.controllers[name]
        except KeyError:
            raise UnknownModel(f"model {name!r} is not configured", param="model") from None

    def _add(self, entry: CatalogEntry) -> None:
        controller = ModelController(entry, self.settings.engine.fairness, self.listeners)
        controller.launch()
        self.controllers[entry.name] = controller

    async def reload(self) -> dict:
        """Reread the files and apply them atomically, or change nothing (400 / 409)."""
        loaded = await asyncio.to_thread(load_settings, self.settings_path)
        new_catalog = build_catalog(loaded)
        diff = self._plan_reload(loaded, new_catalog)
        # -- from here on nothing awaits until the swap is complete --
        removed = [self.controllers.pop(name) for name in diff["removed_models"]]
        self.loaded = loaded
        for name in diff["updated_models"] + diff["unchanged_models"]:
            controller = self.controllers[name]
            controller.replace_entry(new_catalog[name])
            controller.scheduler.fairness = loaded.settings.engine.fairness
        for name in diff["added_models"]:
            self._add(new_catalog[name])
        # -- swap complete --
        await asyncio.gather(*(controller.stop() for controller in removed))
        diff["service_restart_required"] = loaded.settings.service.model_dump() != self.startup_service
        return diff

    def _plan_reload(self, loaded: LoadedSettings, new_catalog: dict[str, CatalogEntry]) -> dict:
        added, removed, updated, unchanged, conflicts = [], [], [], [], []
        for name, controller in self.controllers.items():
            active = controller.state in ACTIVE_STATES
            if name not in new_catalog:
                removed.append(name)
                if active:
                    conflicts.append(f"{name} would be removed while {controller.state.value}")
                continue
            new_entry = new_catalog[name]
            if controller.entry.same_definition(new_entry):
                unchanged.append(name)
                continue
            updated.append(name)
            if active and not controller.entry.same_definition(new_entry, ignore=RELOAD_SAFE_FIELDS):
                conflicts.append(f"{name} would change while {controller.state.value}; unload it first")
        added = [name for name in new_catalog if name not in self.controllers]
        engine_changed = loaded.settings.engine != self.settings.engine
        active_names = [n for n, c in self.controllers.items() if c.state in ACTIVE_STATES]
        if engine_changed and active_names:
            conflicts.append(
                "engine.decoding / engine.fairness would change while models are active: "
                + ", ".join(sorted(active_names))
            )
        if conflicts:
            raise SettingsReloadConflict("settings reload rejected: " + "; ".join(conflicts), details=conflicts)
        return {
            "added_models": sorted(added),
            "removed_models": sorted(removed),
            "updated_models": sorted(updated),
            "unchanged_models": sorted(unchanged),
        }
