"""What an embedding request and a rerank request share (vLLM's "pooling" tasks: one answer per
input, no generation): their wire form, the remote check, and the engine call under the model's
request_timeout_seconds.  ``runtime.inference.embedding`` and ``runtime.inference.rerank`` build on it."""
from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from runtime.errors import RemoteExecutionDisallowed, RequestTimeout

if TYPE_CHECKING:  # runtime.pool.catalog imports the backends, which import this module
    from runtime.pool.catalog import CatalogEntry

Answer = TypeVar("Answer")


class WireRequest:
    """A dataclass request that crosses the channel layer as a dict of its fields."""

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, data: dict[str, Any]):
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


def check_remote_allowed(entry: CatalogEntry, allow_remote: bool) -> None:
    """403 remote_execution_disallowed for a remote model while service.allow_remote_execution is false."""
    if entry.spec.is_remote(entry.definition) and not allow_remote:
        raise RemoteExecutionDisallowed(
            f"model {entry.name} runs on a remote service and service.allow_remote_execution is false"
        )


async def within_request_timeout(controller, lease, call: Awaitable[Answer]) -> Answer:
    """``await call`` (an engine's embed or rerank on ``lease``) within the model's
    request_timeout_seconds: 504 request_timeout past it, and an engine that does not stop is
    killed (``timed_out``)."""
    limit = controller.entry.definition.request_timeout_seconds
    deadline = asyncio.timeout(limit)
    try:
        async with deadline:
            return await call
    except TimeoutError:
        if not deadline.expired():
            raise
        controller.timed_out(lease, limit)
        raise RequestTimeout(
            f"model {controller.name} did not finish the request within request_timeout_seconds={limit:g}"
        ) from None
