"""The pool: every configured model's controller, the settings they came from, and reload.

Reads (snapshots) go straight to the controllers.  A settings reload reads and
validates the files first, then asks every model's writer to vote on the change
(holding its loads until the reload ends), and swaps the catalog only when no
vote is a conflict: all or nothing.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from runtime.catalog import CatalogEntry, build_catalog
from runtime.config import (
    FairnessSettings,
    LoadedSettings,
    Settings,
    key_weights,
    load_settings,
    with_key_weights,
)
from runtime.controller import ModelController
from runtime.engine_process.spares import SPARES
from runtime.errors import SettingsReloadConflict, UnknownModel
from runtime.paths import state_dir
from runtime.state import TransitionEvent

logger = logging.getLogger("llmpool.runtime")

class ModelPool:
    def __init__(self, settings_path: str, listeners: list[Callable[[TransitionEvent], None]] | None = None):
        self.settings_path = settings_path
        self.listeners = listeners if listeners is not None else []
        self.current: LoadedSettings | None = None  # the settings files as last read and applied
        self.startup_service = None
        self.key_weights: dict[str, float] = {}
        self.controllers: dict[str, ModelController] = {}
        self._reload_lock = asyncio.Lock()

    @property
    def settings(self):
        return self.current.settings

    async def start(self, *, load_enabled: bool = True) -> None:
        """Read the settings (raises InvalidSettings) and start loading enabled models in the background."""
        self.current = load_settings(self.settings_path)
        self.startup_service = self.current.settings.service.model_dump()
        # API keys' bucket weights are service settings: read once, like the API process reads the keys.
        self.key_weights = key_weights(self.current.settings.service)
        for name, entry in build_catalog(self.current).items():
            self._add(entry)
        self._keep_spares()
        if load_enabled:
            for controller in self.controllers.values():
                if controller.entry.definition.enabled:
                    controller.begin_load()

    async def shutdown(self) -> None:
        await asyncio.gather(*(controller.stop() for controller in self.controllers.values()))
        self.controllers.clear()
        await SPARES.release(self)

    def _keep_spares(self) -> None:
        """A warm spare engine process for each backend that a model runs in engine processes."""
        definitions = [controller.entry.definition for controller in self.controllers.values()]
        SPARES.keep(self, {d.backend for d in definitions if d.isolation == "process"}, state_dir())

    def controller(self, name: str) -> ModelController:
        try:
            return self.controllers[name]
        except KeyError:
            raise UnknownModel(f"model {name!r} is not configured", param="model") from None

    def fairness(self, settings: Settings) -> FairnessSettings:
        """Every scheduler's fairness settings: ``engine.fairness`` and the API keys' weights."""
        return with_key_weights(settings.engine.fairness, self.key_weights)

    def _add(self, entry: CatalogEntry) -> None:
        controller = ModelController(entry, self.fairness(self.settings), self.listeners)
        controller.launch()
        self.controllers[entry.name] = controller

    async def reload(self) -> dict:
        """Reread the files and apply them atomically, or change nothing (400 / 409).

        Each model's writer votes on the change (and holds its loads meanwhile), so no
        decision rests on a state read from outside the writer; the swap happens only
        when every vote is free of conflict.  One reload runs at a time.
        """
        async with self._reload_lock:
            loaded = await asyncio.to_thread(load_settings, self.settings_path)
            new_catalog = build_catalog(loaded)
            held = dict(self.controllers)
            answers = await asyncio.gather(
                *(controller.hold_for_reload(new_catalog.get(name)) for name, controller in held.items()),
                return_exceptions=True,
            )
            try:
                for answer in answers:
                    if isinstance(answer, BaseException):
                        raise answer
                diff = self._plan_reload(loaded, new_catalog, dict(zip(held, answers)))
            except BaseException:
                await asyncio.gather(
                    *(controller.release_reload() for controller in held.values()), return_exceptions=True
                )
                raise
            removed = [self.controllers.pop(name) for name in diff["removed_models"]]
            self.current = loaded
            fairness = self.fairness(loaded.settings)
            await asyncio.gather(*(
                self.controllers[name].commit_reload(new_catalog[name], fairness)
                for name in diff["updated_models"] + diff["unchanged_models"]
            ))
            for name in diff["added_models"]:
                self._add(new_catalog[name])
            self._keep_spares()
            await asyncio.gather(*(controller.stop() for controller in removed))
        diff["service_restart_required"] = loaded.settings.service.model_dump() != self.startup_service
        return diff

    def _plan_reload(self, loaded: LoadedSettings, new_catalog: dict[str, CatalogEntry], votes: dict) -> dict:
        changes: dict[str, list[str]] = {"removed": [], "updated": [], "unchanged": []}
        conflicts = []
        for name, vote in votes.items():
            changes[vote.change].append(name)
            if vote.conflict:
                conflicts.append(vote.conflict)
        added = [name for name in new_catalog if name not in votes]
        active_names = [name for name, vote in votes.items() if vote.active]
        if loaded.settings.engine != self.settings.engine and active_names:
            conflicts.append(
                "engine.decoding / engine.fairness would change while models are active: "
                + ", ".join(sorted(active_names))
            )
        if conflicts:
            raise SettingsReloadConflict("settings reload rejected: " + "; ".join(conflicts), details=conflicts)
        return {
            "added_models": sorted(added),
            "removed_models": sorted(changes["removed"]),
            "updated_models": sorted(changes["updated"]),
            "unchanged_models": sorted(changes["unchanged"]),
        }
