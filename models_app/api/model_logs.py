"""GET /v1/admin/models/{name}/logs: the tail of each loaded replica's process output, or with
``?follow=true`` a Server-Sent Events stream of it (the runtime's ``model_logs`` operation,
asked again every ``FOLLOW_POLL_SECONDS`` for the lines since the last answer)."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from models_app import placement
from models_app.api.errors import error_answer
from models_app.api.event_stream import sse_event
from models_app.transport.messages import OP_MODEL_LOGS
from runtime.errors import LLMPoolError

FOLLOW_POLL_SECONDS = 0.5
KEEPALIVE_SECONDS = 15.0


async def logs_tail(name: str, lines: str | None) -> dict:
    payload = {"name": name} if lines is None else {"name": name, "lines": lines}
    return await placement.call(OP_MODEL_LOGS, payload)


async def logs_follow(first: dict, name: str) -> AsyncIterator[bytes]:
    """``log`` events ``{"replica", "line"}``: ``first``'s lines, then each new one until the
    client leaves; an ``error`` event (the envelope's error) ends it when the runtime fails."""
    after, quiet = {}, 0.0
    answer = first
    while True:
        sent = False
        for replica in answer["replicas"]:
            key = str(replica["replica"])
            for line in replica["lines"]:
                yield sse_event("log", {"replica": replica["replica"], "line": line})
                sent = True
            after[key] = replica["next"]
        quiet = 0.0 if sent else quiet + FOLLOW_POLL_SECONDS
        if quiet >= KEEPALIVE_SECONDS:
            quiet = 0.0
            yield b": keepalive\n\n"
        await asyncio.sleep(FOLLOW_POLL_SECONDS)
        try:
            answer = await placement.call(OP_MODEL_LOGS, {"name": name, "after": after, "lines": 200})
        except LLMPoolError as exc:
            yield sse_event("error", error_answer(exc).body["error"])
            return
