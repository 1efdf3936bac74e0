"""Helpers for driving the runtime in-process."""
from __future__ import annotations

import json
from pathlib import Path

from runtime.pool import ModelPool
from runtime.state import TransitionEvent


def write_settings(folder: Path, models: dict, **sections) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "settings.json"
    path.write_text(json.dumps({"models": models, **sections}))
    return path


async def start_pool(folder: Path, models: dict, **sections) -> tuple[ModelPool, list[TransitionEvent]]:
    events: list[TransitionEvent] = []
    pool = ModelPool(str(write_settings(folder, models, **sections)), listeners=[events.append])
    await pool.start()
    return pool, events


def moves(events: list[TransitionEvent], model: str) -> list[tuple[str, str]]:
    return [(e.old.value, e.new.value) for e in events if e.model == model]
