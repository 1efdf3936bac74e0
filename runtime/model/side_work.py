"""The slow work of a model's writer: one side task at a time, which reports back as a command.

The writer never awaits an engine itself.  It decides when its engines load or are released, or
when an operation runs (``runtime.model.operations``), and ``SideWork`` runs that work in a task
that ends by posting a command to the writer's inbox (``LoadFinished``, ``UnloadFinished``,
``FailedReleased``, ``OperationFinished``).  ``task`` is the work under way: an unload waits
until none is.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from runtime.model import commands as cmd
from runtime.model.replicas import load_and_measure, release_replicas


class SideWork:
    """The side task under way (``task``, None when none); ``post`` sends a command to the writer."""

    def __init__(self, post: Callable[[cmd.Command], object]):
        self._post = post
        self.task: asyncio.Task | None = None

    def load(self, entry, overrides: dict, count: int, placement, engine_failed) -> None:
        """Load ``count`` replicas of ``entry``; ``LoadFinished`` (and ``LoadProgress`` on the way) report it."""
        self.task = asyncio.get_running_loop().create_task(
            self._load(entry, overrides, count, placement, engine_failed))

    async def _load(self, entry, overrides: dict, count: int, placement, engine_failed) -> None:
        self._post(await load_and_measure(entry, overrides, count, placement, engine_failed, self._progress))

    def _progress(self, stage: str, fraction: float | None) -> None:
        self._post(cmd.LoadProgress(stage, fraction))

    def release(self, engines: list, report: Callable[[list[str]], cmd.Command]) -> None:
        """Release ``engines``; ``report(errors)`` is the command that tells the writer."""
        self.task = asyncio.get_running_loop().create_task(self._release(engines, report))

    async def _release(self, engines: list, report: Callable[[list[str]], cmd.Command]) -> None:
        self._post(report(await release_replicas(engines)))

    def adopt(self, task: asyncio.Task) -> None:
        """An operation's run is the work under way, unless other work is (an unload then waits for it)."""
        if self.task is None:
            self.task = task

    def ended(self, task: asyncio.Task | None = None) -> None:
        """The work under way reported back (``task``: only if it is that one)."""
        if task is None or self.task is task:
            self.task = None

    async def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
