"""The pool: every configured model's controller, the settings they came from, and reload.

Reads (snapshots) go straight to the controllers.  A settings reload reads and
validates the files first, then asks every model's writer to vote on the change
(holding its loads until the reload ends), and swaps the catalog only when no
vote is a conflict: all or nothing.  The pool also holds the swap groups
(``runtime.pool.groups``) and the names a client may give its models: ``lookup`` is how every
inference operation finds the model a request names (``runtime.pool.catalog.canonical_model``).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from runtime.backends.shared.adapters import declared as declared_adapters
from runtime.pool.catalog import CatalogEntry, adapter_bases, base_of, build_catalog, canonical_model, model_names
from runtime.config import (
    FairnessSettings,
    LoadedSettings,
    Settings,
    key_weights,
    load_settings,
    with_key_weights,
)
from runtime.model.controller import ModelController
from runtime.pool.groups import SwapGroup
from runtime.pool.memory import MemoryManager
from runtime.engine_process.spares import SPARES
from runtime.errors import AdapterUnsupported, SettingsReloadAborted, SettingsReloadConflict, UnknownModel
from runtime.paths import state_dir
from runtime.model.state import TransitionEvent

logger = logging.getLogger("llmpool.runtime")

class ModelPool:
    def __init__(self, settings_path: str, listeners: list[Callable[[TransitionEvent], None]] | None = None,
                 node: str | None = None):
        self.settings_path = settings_path
        self.node = node  # the node this pool serves: only the models whose ``node`` includes it
        self.listeners = listeners if listeners is not None else []
        self.current: LoadedSettings | None = None  # the settings files as last read and applied
        self.startup_service = None
        self.key_weights: dict[str, float] = {}
        self.controllers: dict[str, ModelController] = {}
        self.groups: dict[str, SwapGroup] = {}
        self.names: dict[str, str] = {}  # each model's name and alias -> the model (runtime.pool.catalog.model_names)
        self.adapter_bases: dict[str, tuple[str, str]] = {}  # each adapter's model id -> (base, adapter)
        self.memory: MemoryManager | None = None  # device budgets and charges (runtime.pool.memory)
        self._reload_lock = asyncio.Lock()

    @property
    def settings(self):
        return self.current.settings

    async def start(self, *, load_enabled: bool = True) -> None:
        """Read the settings (raises InvalidSettings) and start loading enabled models in the background."""
        self.current = load_settings(self.settings_path, self.node)
        self.startup_service = self.current.settings.service.model_dump()
        # API keys' bucket weights are service settings: read once, like the API process reads the keys.
        self.key_weights = key_weights(self.current.settings.service)
        self.memory = MemoryManager(self.current.settings.memory, lambda: self.controllers)
        self.groups = self._build_groups(self.current.settings, {})
        for name, entry in build_catalog(self.current).items():
            self._add(entry)
        self.names, self.adapter_bases = _names(self.current.settings)
        self._keep_spares()
        if load_enabled:
            for controller in self.controllers.values():
                if controller.entry.definition.enabled:
                    controller.begin_load()

    async def shutdown(self) -> None:
        await asyncio.gather(*(controller.stop() for controller in self.controllers.values()))
        self.controllers.clear()
        for group in self.groups.values():
            group.close()
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

    def lookup(self, name: str) -> ModelController:
        """The controller of the model a request names: by its name or one of its aliases.

        Every inference operation but a generation finds its model here (admin operations use
        ``controller``, which takes names only); an adapter's model id is refused (400
        adapter_unsupported): adapters serve generation only."""
        controller, adapter = self.lookup_target(name)
        if adapter is not None:
            raise AdapterUnsupported(f"{name!r} is the LoRA adapter {adapter!r} of {controller.name}; "
                                     "adapters serve generation only", param="model")
        return controller

    def lookup_target(self, name: str) -> tuple[ModelController, str | None]:
        """The controller a generation runs on and the adapter it applies (None: the model
        itself), for a model's name, an alias, an adapter's id (``<model>:<adapter>``) or its alias."""
        base, adapter = base_of(canonical_model(name, self.names) or "", self.adapter_bases)
        controller = self.controllers.get(base)
        if controller is None:
            raise UnknownModel(f"model {name!r} is not configured", param="model")
        return controller, adapter

    def group_of(self, name: str) -> SwapGroup | None:
        return next((group for group in self.groups.values() if name in group.settings.members), None)

    def _build_groups(self, settings: Settings, keep: dict[str, SwapGroup]) -> dict[str, SwapGroup]:
        """The swap groups of ``settings``; a group in ``keep`` with the same members and
        max_loaded stays the same object (its slots carry on) with the new max_turn_seconds."""
        groups = {}
        for name, config in settings.groups.items():
            group = keep.get(name)
            if group is not None and _same_slots(group.settings, config):
                group.settings = config
            else:
                group = SwapGroup(name, config, self.controllers.get)
            groups[name] = group
        return groups

    def fairness(self, settings: Settings) -> FairnessSettings:
        """Every scheduler's fairness settings: ``engine.fairness`` and the API keys' weights."""
        return with_key_weights(settings.engine.fairness, self.key_weights)

    def _add(self, entry: CatalogEntry) -> None:
        controller = ModelController(
            entry, self.fairness(self.settings), self.listeners, self.group_of(entry.name), self.memory
        )
        controller.launch()
        self.controllers[entry.name] = controller

    async def reload(self, decide: Callable[[dict], Awaitable[bool]] | None = None) -> dict:
        """Reread the files and apply them atomically, or change nothing (400 / 409).

        Each model's writer votes on the change (and holds its loads meanwhile), so no
        decision rests on a state read from outside the writer; the swap happens only
        when every vote is free of conflict.  One reload runs at a time.

        ``decide`` (a reload over several nodes, two-phase): awaited with the checked diff while
        everything is still held; False changes nothing and raises SettingsReloadAborted.
        """
        async with self._reload_lock:
            loaded = await asyncio.to_thread(load_settings, self.settings_path, self.node)
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
                if decide is not None and not await decide(dict(diff)):
                    raise SettingsReloadAborted("settings reload aborted: another node refused it, or the "
                                                "decision did not come in time; nothing changed")
            except BaseException:
                await asyncio.gather(
                    *(controller.release_reload() for controller in held.values()), return_exceptions=True
                )
                raise
            removed = [self.controllers.pop(name) for name in diff["removed_models"]]
            self.current = loaded
            self.memory.configure(loaded.settings.memory)
            fairness = self.fairness(loaded.settings)
            old_groups, self.groups = self.groups, self._build_groups(loaded.settings, self.groups)
            for name, group in old_groups.items():
                if self.groups.get(name) is not group:
                    group.close()
            await asyncio.gather(*(
                self.controllers[name].commit_reload(new_catalog[name], fairness, self.group_of(name))
                for name in diff["updated_models"] + diff["unchanged_models"]
            ))
            for name in diff["added_models"]:
                self._add(new_catalog[name])
            self.names, self.adapter_bases = _names(loaded.settings)
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
        conflicts += self._group_conflicts(loaded.settings, votes)
        if conflicts:
            raise SettingsReloadConflict("settings reload rejected: " + "; ".join(conflicts), details=conflicts)
        return {
            "added_models": sorted(added),
            "removed_models": sorted(changes["removed"]),
            "updated_models": sorted(changes["updated"]),
            "unchanged_models": sorted(changes["unchanged"]),
        }

    def _group_conflicts(self, settings: Settings, votes: dict) -> list[str]:
        """A swap group whose members or max_loaded change while one of its members (before or
        after) is active: its slots are in use, so the reload is refused."""
        conflicts = []
        for name in sorted(set(self.settings.groups) | set(settings.groups)):
            old, new = self.settings.groups.get(name), settings.groups.get(name)
            if old is not None and new is not None and _same_slots(old, new):
                continue
            members = set(old.members if old else ()) | set(new.members if new else ())
            active = sorted(m for m in members if m in votes and votes[m].active)
            if active:
                conflicts.append(f"group {name} would change while {', '.join(active)} active; unload them first")
        return conflicts


def _same_slots(old, new) -> bool:
    return old.members == new.members and old.max_loaded == new.max_loaded


def _names(settings: Settings) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """The names index of ``settings`` (``model_names``) and its adapters' bases (``adapter_bases``)."""
    adapters = {name: {adapter: declared["aliases"] for adapter, declared in declared_adapters(definition).items()}
                for name, definition in settings.models.items()}
    names = model_names({name: definition.aliases for name, definition in settings.models.items()}, adapters)
    return names, adapter_bases(adapters)
