"""The Django catalog mirror of the runtime's catalog: synced when the runtime starts and after
each settings reload (``runtime_host`` runs ``sync`` as a reload listener).

The runtime's catalog is the truth and the mirror only a copy for the Django side, so a database
that cannot be reached fails neither the start nor a reload: the sync is logged and retried in
the background (every ``RETRY_SECONDS``) until it succeeds or a newer sync replaces it.
"""
from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async
from django.db import DatabaseError

from models_app import services
from runtime.service import RuntimeService

logger = logging.getLogger("llmpool.runtime")

RETRY_SECONDS = 5.0
_retry: asyncio.Task | None = None


async def sync(service: RuntimeService) -> None:
    """Make the mirror equal to ``service``'s catalog (one row per configured model); when the
    database is unavailable, keep trying in the background instead of raising."""
    global _retry
    if _retry is not None:
        _retry.cancel()
        _retry = None
    if not await _sync_once(service):
        _retry = asyncio.create_task(_retry_until_synced(service))


async def _sync_once(service: RuntimeService, *, retrying: bool = False) -> bool:
    catalog = await service.op_catalog({}, None)
    try:
        # Other nodes' models (configured_models) keep their rows: each node writes its own.
        await database_sync_to_async(services.catalog_sync)(catalog["models"], catalog.get("configured_models"))
    except DatabaseError as exc:
        logger.log(logging.DEBUG if retrying else logging.WARNING,
                   "the catalog mirror could not be written (database unavailable: %s); retrying every %g s",
                   " ".join(str(exc).split()), RETRY_SECONDS)
        return False
    return True


async def _retry_until_synced(service: RuntimeService) -> None:
    while True:
        await asyncio.sleep(RETRY_SECONDS)
        if await _sync_once(service, retrying=True):
            logger.info("the catalog mirror is synced again")
            return

