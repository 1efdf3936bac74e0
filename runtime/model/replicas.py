"""Building and releasing a model's replicas: the slow work a controller runs in a side task.

The model's writer (``runtime.model.writer``) owns the model's state and never awaits
an engine itself; ``load_replicas`` and ``release_replicas`` do, and it hears
their outcome back through its inbox.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from enum import Enum

from runtime import gpu
from runtime.backends.base import Engine
from runtime.errors import InvalidLoadRequest, ModelStateConflict
from runtime.pool.catalog import CatalogEntry
from runtime.engine_process.engine import ProcessEngine
from runtime.model import commands as cmd
from runtime.model.load_progress import ProgressCallback, replica_reporter
from runtime.model.memory_claim import measure_engines, process_rss_mib
from runtime.model.phases import Mark
from runtime.model.state import RuntimeState
from runtime.paths import state_dir

logger = logging.getLogger("llmpool.runtime")

S = RuntimeState


class LoadGate(Enum):
    """What a ``Load`` command does, from the model's record (the writer applies it)."""

    HOLD = "hold"  # a settings reload holds the model: the load waits until it ends
    DONE = "done"  # loaded or loading already, as asked: nothing to do
    BEGIN = "begin"  # the load begins (checked and planned first)


def load_gate(model, overrides: dict, replicas: int | None) -> LoadGate:
    """What a load with ``overrides`` and ``replicas`` does to ``model`` (its controller); a load
    that changes a loaded model, or one during an unload, raises having changed nothing."""
    if model.phases.has(Mark.RELOAD_HELD):
        return LoadGate.HOLD
    state = model.state
    if state in (S.LOADED, S.LOADING):
        if (overrides and overrides != model.load_override) or (replicas is not None and replicas != model.replicas):
            raise InvalidLoadRequest(
                f"model {model.name} is {state.value}; replicas and load overrides may only be changed "
                "while it is unloaded or failed (unload it first)"
            )
        return LoadGate.DONE
    if state is S.UNLOADING:
        raise ModelStateConflict(f"model {model.name} is unloading; load it again once it is unloaded")
    return LoadGate.BEGIN


def checked_load_body(entry: CatalogEntry, overrides: dict, replicas: int | None) -> tuple[int, dict]:
    """A load's replica count and accepted overrides (400 invalid_load_request otherwise)."""
    definition = entry.definition
    count = definition.replicas if replicas is None else replicas
    if count > definition.replica_max:
        raise InvalidLoadRequest(
            f"replicas={count} exceeds replica_max={definition.replica_max} of model {entry.name}",
            param="replicas",
        )
    return count, entry.spec.validate_overrides(definition, overrides)


class ReplicaLoadError(Exception):
    def __init__(self, index: int, count: int, cause: Exception):
        detail = str(cause) or type(cause).__name__
        super().__init__(f"replica {index + 1} of {count} failed to load: {detail}")


def create_replica(entry: CatalogEntry, config: dict, index: int, context: dict) -> Engine:
    """One replica's engine: in an engine process when the definition says ``isolation: process``."""
    if config["isolation"] == "process":
        return ProcessEngine(entry.name, config, index, context)
    return entry.spec.create_engine(entry.name, config, index, context)


async def load_replicas(
    entry: CatalogEntry, overrides: dict, count: int, on_engine_failure: Callable[[str, int], None],
    on_load_progress: ProgressCallback | None = None,
) -> tuple[list[Engine], int | None]:
    """Load ``count`` replicas one after the other, all or nothing.

    Returns the engines and the GPU memory the load took (MiB, None when no GPU is
    visible).  On any failure, or when cancelled, the replicas loaded so far are
    released first; a replica's failure raises ``ReplicaLoadError`` naming it.
    ``on_engine_failure(message, replica index)`` hears a loaded engine's death.
    ``on_load_progress`` hears each replica's stages, its fraction scaled into the whole load's
    (runtime.model.load_progress).
    """
    config = entry.spec.effective_config(entry.definition, overrides)
    context = {
        "base_dir": entry.base_dir,
        "model_name": entry.name,
        "state_dir": state_dir(),
        "kv_store": entry.kv_store,
    }
    engines: list[Engine] = []
    try:
        used_before = await asyncio.to_thread(gpu.used_memory_mib)
        for index in range(count):
            replica_context = _replica_context(context, index, count, on_engine_failure, on_load_progress)
            engine = create_replica(entry, config, index, replica_context)
            engines.append(engine)
            try:
                await engine.load()
            except Exception as exc:
                raise ReplicaLoadError(index, count, exc) from exc
        used_after = await asyncio.to_thread(gpu.used_memory_mib)
    except BaseException:
        await release_replicas(engines)
        raise
    return engines, gpu.load_delta(used_before, used_after)


async def load_and_measure(
    entry: CatalogEntry, overrides: dict, count: int, placement: list[str] | None,
    on_engine_failure: Callable[[str, int], None], on_load_progress: ProgressCallback,
) -> cmd.LoadFinished:
    """``load_replicas``, with what the loaded model holds measured (``measure_engines``: the
    engines' own figures, else the GPU delta, else the runtime process's RSS growth); a failure
    is the command's ``error``."""
    try:
        rss_before = await asyncio.to_thread(process_rss_mib)
        engines, observed_mib = await load_replicas(entry, overrides, count, on_engine_failure, on_load_progress)
        rss_after = await asyncio.to_thread(process_rss_mib)
        rss_delta = None if None in (rss_before, rss_after) else max(0, rss_after - rss_before)
        measured = await measure_engines(engines, placement, observed_mib, rss_delta)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return cmd.LoadFinished(None, str(exc) or type(exc).__name__)
    return cmd.LoadFinished(engines, None, observed_mib, measured)


def _replica_context(context: dict, index: int, count: int, on_engine_failure: Callable[[str, int], None],
                     on_load_progress: ProgressCallback | None) -> dict:
    """``context`` for replica ``index``: its engine's death and its load's stages name it."""
    # An engine calls this (from the event loop) when it dies while loaded.
    replica = {**context, "on_engine_failure": lambda message: on_engine_failure(message, index)}
    if on_load_progress is not None:
        replica["on_load_progress"] = replica_reporter(on_load_progress, index, count)
    return replica


async def release_replicas(engines: list[Engine]) -> list[str]:
    """Unload every engine, whatever the others do; the errors, one line per failed replica."""
    errors = []
    for index, engine in enumerate(engines):
        try:
            await engine.unload()
        except Exception as exc:
            logger.exception("unloading replica %d failed", index)
            errors.append(f"replica {index + 1}: {exc}")
    return errors
