"""Helpers for driving the runtime in-process."""
from __future__ import annotations

from pathlib import Path

from runtime.pool.model_pool import ModelPool
from runtime.model.state import TransitionEvent
from tests.conftest import write_settings

# The exact transitions of a load and of an unload that succeed.
LOAD_CYCLE = [("unloaded", "loading"), ("loading", "loaded")]
UNLOAD_CYCLE = [("loaded", "unloading"), ("unloading", "unloaded")]


async def start_pool(folder: Path, models: dict, **sections) -> tuple[ModelPool, list[TransitionEvent]]:
    events: list[TransitionEvent] = []
    pool = ModelPool(str(write_settings(folder, models, **sections)), listeners=[events.append])
    await pool.start()
    return pool, events


def moves(events: list, model: str) -> list[tuple[str, str]]:
    """The transitions of ``model`` among ``events`` (the other events a listener hears left out)."""
    return [(e.old.value, e.new.value) for e in events if isinstance(e, TransitionEvent) and e.model == model]
