"""Prefix-affinity routing over two real SmolLM2 replicas: a conversation's next turn goes back to
the replica whose KV cache holds it (usage's cached_tokens covers its earlier turn), where
least-loaded routing sends it to the lowest idle replica, which prefills it all again."""
from __future__ import annotations

import asyncio

import pytest
from llama_helpers import SMOLLM2_MODEL

from runtime.service import RuntimeService
from tests.conftest import write_settings
from tests.engines.runtime_driver import without_timings


def message(role: str, text: str) -> dict:
    return {"role": role, "content": [{"type": "input_text", "text": text}]}


async def ask(service: RuntimeService, name: str, messages: list[dict]) -> dict:
    payload = {"request_id": f"{name}-{len(messages)}", "model": "m", "messages": messages,
               "instructions": f"You are the assistant of {name}. Answer in a few words.",
               "max_output_tokens": 6, "temperature": 0.0}
    return without_timings(await service.handle("generate", payload, None))


async def second_turns(tmp_path, prefix_affinity: bool) -> dict[str, tuple[dict, dict]]:
    """Both conversations' first turns at once (one per replica), then b's second turn and a's,
    one at a time: name -> (first result, second result)."""
    settings = write_settings(tmp_path, {"m": {**SMOLLM2_MODEL, "replicas": 2}},
                              engine={"routing": {"prefix_affinity": prefix_affinity}})
    service = RuntimeService(str(settings))
    await service.start(load_enabled=False)
    try:
        await service.handle("load", {"name": "m", "body": None}, None)
        asked = {name: [message("user", f"Hello, I am {name}. What is two plus two?")] for name in ("ann", "bob")}
        firsts = dict(zip(asked, await asyncio.gather(*(ask(service, name, asked[name]) for name in asked))))
        seconds = {}
        for name in ("bob", "ann"):
            asked[name] += [message("assistant", firsts[name]["text"]), message("user", "And three plus three?")]
            seconds[name] = await ask(service, name, asked[name])
        return {name: (firsts[name], seconds[name]) for name in asked}
    finally:
        await service.shutdown()


@pytest.mark.parametrize("prefix_affinity", [True, False])
async def test_a_later_turn_reuses_the_cache_of_the_replica_that_served_its_conversation(tmp_path, prefix_affinity):
    turns = await second_turns(tmp_path, prefix_affinity)
    hits = {name: second["usage"]["cached_tokens"] >= first["usage"]["input_tokens"]
            for name, (first, second) in turns.items()}
    if prefix_affinity:
        assert hits == {"ann": True, "bob": True}
    else:  # bob's turn goes to replica 0, which holds ann's: both prefill again
        assert hits == {"ann": False, "bob": False}
