"""The Django catalog mirror of the runtime's catalog: synced when the runtime starts and after
each settings reload (``runtime_host`` runs ``sync`` as a reload listener)."""
from __future__ import annotations

from channels.db import database_sync_to_async

from models_app import services
from runtime.service import RuntimeService


async def sync(service: RuntimeService) -> None:
    """Make the mirror equal to ``service``'s catalog (one row per configured model)."""
    catalog = await service.op_catalog({}, None)
    await database_sync_to_async(services.catalog_sync)(catalog["models"])
