"""What a long chat conversation costs on its way from the API to the runtime, in one process.

A ``/v1/chat/completions`` body of ``--messages`` messages and about ``--kib`` KiB of text goes
through the API's steps (``parse_json``, ``parse_chat_body``, ``ForwardedRequest.to_wire``), the
channel layer's copy (msgpack out and in: what the embedded layer does to every message, and what
the Redis layer sends) and the runtime's ``request_from_wire``.  ``once`` is the message
as llm-pool sends it (the conversation once, as the client's body; the runtime builds the typed
messages again from it); ``twice`` the same request with its typed messages on the wire too.
Prints one JSON object: the message's size and the median microseconds of
each step over ``--rounds`` rounds.  ``--service N`` also sends the body N times, non-streamed and
one after another, to a stub model at zero delay through ``manage.py serve`` (embedded) and the split
(Redis on 127.0.0.1:6379), and gives each one's p50 / p99 in ms (the stub reads the whole
conversation too, so these are not the channel's share alone).
Run: .venv/bin/python bench/chat_message.py [--kib 100] [--messages 60] [--rounds 300] [--service 400]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx
import msgpack
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmpool.settings")

import django  # noqa: E402

django.setup()

from bench.common import percentiles, running_service  # noqa: E402
from models_app.api.limits import parse_json  # noqa: E402
from models_app.api.chat.protocol import parse_chat_body  # noqa: E402
from runtime.inputs.request import request_from_wire  # noqa: E402


def conversation(kib: int, messages: int) -> bytes:
    text = ("The quick brown fox jumps over the lazy dog. " * (kib * 1024 // 45 // messages + 1))
    turns = [{"role": "system", "content": "You are a helpful assistant."}]
    for index in range(messages - 1):
        turns.append({"role": "user" if index % 2 == 0 else "assistant", "content": text})
    if turns[-1]["role"] != "user":
        turns.append({"role": "user", "content": "Go on."})
    return orjson.dumps({"model": "smol", "messages": turns, "max_tokens": 1})


def timed(step, rounds: int) -> tuple[float, object]:
    times, value = [], None
    for _ in range(rounds):
        start = time.perf_counter()
        value = step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6, value


def measure(raw: bytes, rounds: int, keep_messages: bool) -> dict:
    parse_us, data = timed(lambda: parse_json(raw), rounds)
    typed_us, chat = timed(lambda: parse_chat_body(data, None), rounds)
    request = chat.forwarded
    if keep_messages:  # the typed messages on the wire too
        request.messages_from_body = False
    wire_us, wire = timed(request.to_wire, rounds)
    pack_us, packed = timed(lambda: msgpack.packb(wire), rounds)
    unpack_us, unpacked = timed(lambda: msgpack.unpackb(packed), rounds)
    rebuild_us, rebuilt = timed(lambda: request_from_wire(unpacked), rounds)
    assert rebuilt.typed.messages == request.typed.messages and rebuilt.body == data
    return {
        "message_kib": round(len(packed) / 1024, 1),
        "parse_json_us": round(parse_us, 1),
        "parse_chat_body_us": round(typed_us, 1),
        "to_wire_us": round(wire_us, 1),
        "msgpack_pack_us": round(pack_us, 1),
        "msgpack_unpack_us": round(unpack_us, 1),
        "from_wire_us": round(rebuild_us, 1),
        "channel_and_runtime_us": round(wire_us + pack_us + unpack_us + rebuild_us, 1),
    }


STUB_SETTINGS = {
    "engine": {"fairness": {"per_key_queue_limit": 10000, "executor_queue_limit": 10000}},
    "models": {"smol": {"backend": "stub", "enabled": True}},
}


async def service_latencies(url: str, raw: bytes, requests: int) -> dict:
    latencies = []
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for index in range(requests + 20):  # the first 20 warm up
            began = time.perf_counter()
            response = await http.post("/v1/chat/completions", content=raw, headers=headers)
            if index >= 20:
                latencies.append(time.perf_counter() - began)
            response.raise_for_status()
    return percentiles(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kib", type=int, default=100)
    parser.add_argument("--messages", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--service", type=int, default=0, help="requests through the service, each shape")
    args = parser.parse_args()
    raw = conversation(args.kib, args.messages)
    result = {"body_kib": round(len(raw) / 1024, 1), "messages": len(orjson.loads(raw)["messages"])}
    for _ in range(2):  # alternate, so a warm-up or a noisy moment does not favour one
        result.setdefault("once", []).append(measure(raw, args.rounds, keep_messages=False))
        result.setdefault("twice", []).append(measure(raw, args.rounds, keep_messages=True))
    for mode in ("embedded", "split") if args.service else ():
        with running_service(STUB_SETTINGS, mode) as url:
            result[f"service_{mode}"] = asyncio.run(service_latencies(url, raw, args.service))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
