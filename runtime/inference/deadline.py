"""The model's ``request_timeout_seconds`` around one request's run on a replica's engine."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from runtime.errors import RequestTimeout


@asynccontextmanager
async def request_deadline(controller, lease) -> AsyncIterator[None]:
    """Run the block within the model's ``request_timeout_seconds`` (null: no limit).  Past it the
    block is cancelled, the engine of ``lease`` is killed if it does not stop (the controller's
    ``timed_out``) and ``RequestTimeout`` (504) raises; a TimeoutError of the engine's own is raised
    as it is."""
    limit = controller.entry.definition.request_timeout_seconds
    deadline = asyncio.timeout(limit)
    try:
        async with deadline:
            yield
    except TimeoutError:
        if not deadline.expired():
            raise  # the engine's own timeout, not the model's limit
        controller.timed_out(lease, limit)  # an engine that did not stop is killed
        raise RequestTimeout(
            f"model {controller.name} did not finish the request within request_timeout_seconds={limit:g}"
        ) from None
