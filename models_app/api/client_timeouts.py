"""Bounds on clients that are slow on purpose or by accident, whatever the HTTP server.

- **The request body** (every HTTP request): it must arrive in full within
  ``service.request_body_timeout_seconds`` of the application's first read, else the answer is
  408 ``request_body_timeout`` and the connection is closed.  The application sees the timeout
  as the client's disconnect (Django and the inference apps then stop quietly), and the
  middleware answers, so a trickling body never reaches a view, the runtime or a queue.
- **A stream nobody reads** (the inference apps' event streams): each write to the client may
  wait at most ``service.stream_write_timeout_seconds`` for room in the connection's buffer
  (uvicorn applies backpressure: a client that reads nothing stops the stream).  Past that the
  stream is ended and its request cancelled, so the engine slot is freed
  (``stream_write``, used by ``api.inference``).

Neither needs a reverse proxy in front; nginx's ``client_body_timeout`` and ``send_timeout`` are
the same two bounds (60 s by default there, as here).
"""
from __future__ import annotations

import asyncio
import logging

from models_app.api.errors import send_error
from models_app.conf import service_settings
from runtime.errors import LLMPoolError, RequestBodyTimeout

logger = logging.getLogger("llmpool.api")


class StreamWriteTimeout(Exception):
    """The client read nothing for ``stream_write_timeout_seconds``: end its stream."""


async def stream_write(send, message: dict) -> None:
    """``send(message)``, waiting at most the stream write timeout for the client to make room."""
    try:
        async with asyncio.timeout(service_settings().stream_write_timeout_seconds):
            await send(message)
    except TimeoutError:
        raise StreamWriteTimeout from None


def with_client_timeouts(app):
    """``app`` (ASGI, HTTP) behind the body read timeout."""

    async def bounded(scope, receive, send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        timeout = service_settings().request_body_timeout_seconds
        loop = asyncio.get_running_loop()
        state = {"deadline": None, "body_done": False, "timed_out": False, "started": False}

        async def timed_receive():
            if state["body_done"]:
                return await receive()
            if state["deadline"] is None:
                state["deadline"] = loop.time() + timeout
            try:
                async with asyncio.timeout_at(state["deadline"]):
                    message = await receive()
            except TimeoutError:
                state["timed_out"] = state["body_done"] = True
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                state["body_done"] = True
            return message

        async def tracked_send(message):
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        await app(scope, timed_receive, tracked_send)
        if state["timed_out"] and not state["started"]:
            await _refuse(send, RequestBodyTimeout(
                f"the request body did not arrive within {timeout:g} s (service.request_body_timeout_seconds)"
            ))

    return bounded


async def _refuse(send, exc: LLMPoolError) -> None:
    await send_error(send, exc, {"Connection": "close"})
