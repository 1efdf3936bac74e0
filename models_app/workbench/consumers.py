"""The admin pages' live feed: a WebSocket that forwards every runtime event to staff browsers.

On connect a staff user (session login, as for /admin) gets a ``snapshot``
of every model's AdminModelEntry, then each ``transition``, ``counters`` and
``catalog`` event as the runtime publishes it (see ``models_app.host.event_publisher``).
Anyone else is refused before the handshake completes, and so is a page of another origin
(``models_app.workbench.origin``).  Sending
``{"op": "snapshot"}`` asks for a fresh snapshot.
"""
from __future__ import annotations

import logging

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from models_app import selectors
from models_app.api.errors import error_answer
from models_app.transport.messages import ADMIN_EVENTS_GROUP, EVENT_SNAPSHOT
from runtime.errors import LLMPoolError

logger = logging.getLogger("llmpool.events")

# WebSocket close code for "not allowed" (4000-4999 are application codes).
CLOSE_FORBIDDEN = 4403


class AdminEventsConsumer(AsyncJsonWebsocketConsumer):
    joined = False

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not (user.is_active and user.is_staff):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        await self.channel_layer.group_add(ADMIN_EVENTS_GROUP, self.channel_name)
        self.joined = True
        await self.accept()
        await self.send_snapshot()

    async def disconnect(self, code) -> None:
        if self.joined:
            await self.channel_layer.group_discard(ADMIN_EVENTS_GROUP, self.channel_name)

    async def receive_json(self, content, **kwargs) -> None:
        if isinstance(content, dict) and content.get("op") == EVENT_SNAPSHOT:
            await self.send_snapshot()

    async def admin_event(self, message: dict) -> None:
        await self.send_json(message["event"])

    async def send_snapshot(self) -> None:
        try:
            snapshot = {"kind": EVENT_SNAPSHOT, "models": await selectors.models_list(), "error": None}
        except LLMPoolError as exc:
            logger.warning("admin WebSocket snapshot failed: %s", exc.message)
            snapshot = {"kind": EVENT_SNAPSHOT, "models": None, "error": error_answer(exc).body["error"]}
        await self.send_json(snapshot)
