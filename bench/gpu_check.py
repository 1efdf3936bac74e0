"""The GPU check: llm-pool's llama.cpp backends on a real GPU, in one run (docs/gpu.md).

Run by ``scripts/gpu_check.sh run`` on a GPU machine, after the CUDA build of llama-server and
libllama (``scripts/gpu_check.sh build``). With SmolLM2-135M and Gemma 3 270M, each as
``llama_cpp`` (an engine process, every layer on the GPU, llama-cpp-python over the CUDA library)
and as ``llama_server`` (the CUDA llama-server), it reports:

1. ``GET /v1/admin/gpu-memory`` next to nvidia-smi's own totals, and the ``observed_load_delta``
   of a stub whose two replicas each allocate 2 GiB with PyTorch (kept after its unload);
2. for each of the four models: the estimate before its first load (with its parts), the device
   memory its process holds once loaded (NVML's per-process figure, through nvidia-smi), their
   ratio, the charge llm-pool holds, decode tokens/s of a streamed answer, and the device's used
   memory back within the tolerance after an unload and after a ``kill -9`` of its process;
3. a second service whose ``cuda:0`` budget holds one model but not two, with
   ``"eviction": "idle_lru"``: a request for the second model evicts the first, whose process and
   memory are gone, for both backends;
4. a swap A -> B -> A next to llama.cpp's router mode (``--models-max 1``) on the same binary and
   files (bench/router_swap.py).

Each check prints one verdict line as it finishes; the whole report is JSON on stdout at the end
and in ``--out``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import router_swap  # noqa: E402
from bench.common import running_service  # noqa: E402

TOLERANCE_MIB = 64
PROMPT = "Write the numbers from 1 to 400, separated by single spaces, and nothing else."
report: dict = {"checks": {}, "tolerance_mib": TOLERANCE_MIB}


def check(name: str, ok: bool, detail) -> bool:
    report["checks"][name] = {"ok": bool(ok), "detail": detail}
    print(f"{'PASS' if ok else 'FAIL'} {name}: {json.dumps(detail, default=str)[:400]}", flush=True)
    return bool(ok)


def smi(*query: str) -> list[list[str]]:
    out = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         check=True).stdout
    return [[field.strip() for field in line.split(",")] for line in out.splitlines() if line.strip()]


def used_mib() -> int:
    return sum(int(row[0]) for row in smi("--query-gpu=memory.used"))


def processes() -> dict[int, int]:
    """pid -> device MiB of every process holding device memory (NVML's per-process figure)."""
    return {int(row[0]): int(row[1]) for row in smi("--query-compute-apps=pid,used_memory") if row[0].isdigit()}


def settle(baseline: int, timeout: float = 20.0) -> tuple[int, float]:
    """Wait for the device's used memory to come back to ``baseline`` (within the tolerance)."""
    began = time.monotonic()
    while True:
        used = used_mib()
        if abs(used - baseline) <= TOLERANCE_MIB or time.monotonic() - began > timeout:
            return used, round(time.monotonic() - began, 2)
        time.sleep(0.25)


def entry(http: httpx.Client, name: str) -> dict:
    return next(m for m in http.get("/v1/admin/models").json()["models"] if m["name"] == name)


def wait_state(http: httpx.Client, name: str, leave: str, timeout: float = 30.0) -> dict:
    """The model's entry once its state is not ``leave`` (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        current = entry(http, name)
        if current["runtime_state"] != leave or time.monotonic() > deadline:
            return current
        time.sleep(0.1)


def stream_figures(http: httpx.Client, name: str, tokens: int = 256) -> dict:
    """Decode tokens/s of one streamed chat answer (chunks after the first over their time)."""
    body = {"model": name, "max_tokens": tokens, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": PROMPT}]}
    began = time.perf_counter()
    stamps: list[float] = []
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            return {"error": f"{response.status_code} {response.read()[:300]!r}"}
        for line in response.iter_lines():
            if line.startswith("data: {") and '"content"' in line and '"content":""' not in line.replace(" ", ""):
                stamps.append(time.perf_counter())
    if len(stamps) < 2:
        return {"chunks": len(stamps)}
    return {"chunks": len(stamps), "ttft_ms": round((stamps[0] - began) * 1000, 1),
            "decode_tokens_per_s": round((len(stamps) - 1) / (stamps[-1] - stamps[0]), 1)}


def models(files: dict[str, str], binary: str, budget: dict | None = None) -> dict:
    cpp = {"backend": "llama_cpp", "gguf_n_gpu_layers": -1, "gguf_n_ctx": 4096, "load_on_request": True}
    srv = {"backend": "llama_server", "llama_server_binary": binary, "llama_server_n_gpu_layers": "all",
           "llama_server_n_ctx": 4096, "load_on_request": True}
    definitions = {}
    for label, path in files.items():
        definitions[f"{label}-cpp"] = {**cpp, "model_path": path, **router_swap.prompt_format(path, "llama_cpp")}
        definitions[f"{label}-srv"] = {**srv, "model_path": path}
    definitions["context"] = {"backend": "stub", "stub_gpu_alloc_mib": 2}
    definitions["probe"] = {"backend": "stub", "stub_gpu_alloc_mib": 2048, "replicas": 2, "replica_max": 2}
    settings = {"service": {"log_level": "warning"}, "models": definitions}
    if budget:
        settings["memory"] = budget
    return settings


def one_model(http: httpx.Client, name: str) -> dict:
    """Estimate, load, per-process memory, tokens/s, unload, kill -9: one model's figures."""
    figures: dict = {}
    baseline, before = used_mib(), processes()
    estimate = entry(http, name)["memory"]
    figures["estimate"] = {k: estimate.get(k) for k in ("estimate_mib", "estimate_source", "estimate_parts")}
    began = time.perf_counter()
    loaded = http.post(f"/v1/admin/models/{name}/load").json()
    figures["load_ms"] = round((time.perf_counter() - began) * 1000, 1)
    if not check(f"{name}_loaded", loaded.get("runtime_state") == "loaded", loaded.get("last_error")):
        return figures
    now = processes()
    mine = {pid: mib for pid, mib in now.items() if pid not in before}
    measured = sum(mine.values())
    held = entry(http, name)["memory"]
    figures.update(processes=mine, measured_mib=measured, used_delta_mib=used_mib() - baseline,
                   charge_mib=held.get("charge_mib"), charge=held.get("charge"),
                   next_estimate=(held.get("estimate_mib"), held.get("estimate_source")))
    est = figures["estimate"]["estimate_mib"] or 0
    figures["estimate_over_measured"] = round(est / measured, 3) if measured else None
    check(f"{name}_on_the_gpu", measured > 0, mine)
    check(f"{name}_estimate_within_15pct", measured > 0 and abs(est - measured) <= 0.15 * measured,
          {"estimate_mib": est, "measured_mib": measured, "parts": figures["estimate"]["estimate_parts"]})
    stream_figures(http, name, 8)  # warm-up: the first request's own costs stay out of the figure
    figures["stream"] = stream_figures(http, name)
    check(f"{name}_streams", "decode_tokens_per_s" in figures["stream"], figures["stream"])

    http.post(f"/v1/admin/models/{name}/unload")
    used, waited = settle(baseline)
    figures["after_unload"] = {"used_mib": used, "baseline_mib": baseline, "waited_s": waited,
                               "process_left": sorted(set(mine) & set(processes()))}
    check(f"{name}_memory_back_after_unload", abs(used - baseline) <= TOLERANCE_MIB and not figures["after_unload"]["process_left"],
          figures["after_unload"])

    http.post(f"/v1/admin/models/{name}/load")
    victims = [pid for pid in processes() if pid not in before]
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    state = wait_state(http, name, "loaded")
    used, waited = settle(baseline)
    figures["after_kill"] = {"killed": victims, "state": state["runtime_state"], "last_error": (state.get("last_error") or "")[:200],
                             "used_mib": used, "baseline_mib": baseline, "waited_s": waited}
    check(f"{name}_memory_back_after_kill_9", bool(victims) and abs(used - baseline) <= TOLERANCE_MIB, figures["after_kill"])
    http.post(f"/v1/admin/models/{name}/unload")
    wait_state(http, name, "unloading")
    return figures


def eviction(http: httpx.Client, first: str, second: str) -> dict:
    """``first`` loaded, a request for ``second`` under a budget that holds one: ``first`` evicted."""
    baseline, before = used_mib(), processes()
    http.post(f"/v1/admin/models/{first}/load")
    first_pids = {pid for pid in processes() if pid not in before}
    answer = http.post("/v1/chat/completions", json={"model": second, "max_tokens": 4, "temperature": 0,
                                                      "messages": [{"role": "user", "content": "Hello"}]})
    states = {name: entry(http, name) for name in (first, second)}
    now = processes()
    second_pids = {pid: mib for pid, mib in now.items() if pid not in before and pid not in first_pids}
    used = used_mib()
    figures = {"answer": answer.status_code, "first_state": states[first]["runtime_state"],
               "second_state": states[second]["runtime_state"], "first_pids_left": sorted(first_pids & set(now)),
               "second_mib": sum(second_pids.values()), "used_mib": used, "baseline_mib": baseline,
               "second_charge": states[second]["memory"].get("charge_mib")}
    check(f"idle_lru_evicts_{first}_for_{second}",
          answer.status_code == 200 and figures["first_state"] == "unloaded" and figures["second_state"] == "loaded"
          and not figures["first_pids_left"] and abs(used - baseline - figures["second_mib"]) <= TOLERANCE_MIB,
          figures)
    for name in (first, second):
        http.post(f"/v1/admin/models/{name}/unload")
    settle(baseline)
    return figures


def stub_delta(http: httpx.Client, alloc_mib: int = 2048, replicas: int = 2) -> dict:
    """``observed_load_delta`` of a stub whose replicas each allocate ``alloc_mib`` with PyTorch:
    it must come out within the tolerance of replicas x that, and stay after the unload."""
    http.post("/v1/admin/models/context/load")  # the runtime process's own CUDA context, apart
    loaded = http.post("/v1/admin/models/probe/load").json()
    entry_of = lambda: next(m for m in http.get("/v1/admin/gpu-memory").json()["models"] if m["name"] == "probe")  # noqa: E731
    probe = entry_of()
    figures = {"state": loaded.get("runtime_state"), "last_error": loaded.get("last_error"),
               "observed_mib": probe.get("vram_estimate_mib"), "source": probe.get("vram_estimate_source"),
               "replica_count": probe.get("vram_estimate_replica_count"), "expected_mib": alloc_mib * replicas}
    check("stub_observed_load_delta_near_allocation",
          figures["source"] == "observed_load_delta" and figures["replica_count"] == replicas
          and abs((figures["observed_mib"] or 0) - alloc_mib * replicas) <= TOLERANCE_MIB, figures)
    http.post("/v1/admin/models/probe/unload")
    kept = entry_of()
    check("stub_estimate_kept_after_unload",
          (kept.get("vram_estimate_mib"), kept.get("vram_estimate_source")) == (figures["observed_mib"], figures["source"]), kept)
    http.post("/v1/admin/models/context/unload")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", required=True, help="the CUDA llama-server")
    parser.add_argument("--smollm2", required=True)
    parser.add_argument("--gemma", required=True)
    parser.add_argument("--swaps", type=int, default=6)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: models,eviction,router")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    files = {"smol": args.smollm2, "gemma": args.gemma}
    report["nvidia_smi"] = smi("--query-gpu=index,name,memory.used,memory.total,driver_version")
    try:
        if "models" not in skip:
            with running_service(models(files, args.binary)) as url, httpx.Client(base_url=url, timeout=300) as http:
                memory = http.get("/v1/admin/gpu-memory").json()
                check("gpu_memory_matches_nvidia_smi",
                      [g["total_mib"] for g in memory["gpus"]] == [int(row[3]) for row in report["nvidia_smi"]],
                      {"llmpool": [g["used_over_total"] for g in memory["gpus"]], "error": memory["error"]})
                report["stub"] = stub_delta(http)
                report["models"] = {name: one_model(http, name) for name in models(files, args.binary)["models"]
                                    if name not in ("context", "probe")}
        if "eviction" not in skip:
            measured = [f.get("measured_mib") or 0 for f in report.get("models", {}).values()]
            budget_mib = (max(measured) if any(measured) else 1024) + 128
            budget = {"devices": {"cuda:0": {"budget_mib": budget_mib}}, "eviction": "idle_lru"}
            report["eviction"] = {"budget_mib": budget_mib}
            with running_service(models(files, args.binary, budget)) as url, httpx.Client(base_url=url, timeout=300) as http:
                for backend in ("srv", "cpp"):
                    report["eviction"][backend] = eviction(http, f"smol-{backend}", f"gemma-{backend}")
        if "router" not in skip:
            swap_args = argparse.Namespace(binary=args.binary, swaps=args.swaps, threads=4, n_gpu_layers=99, ctx=4096)
            swap = router_swap.measure(args.binary, {"a": args.smollm2, "b": args.gemma}, swap_args)
            report["router_swap"] = swap
            for system in ("llama_server", "llama_cpp"):
                if system in swap["failed"] or "router" in swap["failed"]:
                    check(f"{system}_swap_at_most_router", False, swap["failed"])
                    continue
                check(f"{system}_swap_at_most_router", swap[f"{system}_over_router"] <= 1.0,
                      {"ratio": swap[f"{system}_over_router"], "median_ms": swap[system]["swap"]["median_ms"],
                       "router_median_ms": swap["router"]["swap"]["median_ms"]})
    except Exception as exc:  # the figures so far still come back
        check("run_completed", False, repr(exc))
        raise
    finally:
        report["passed"] = bool(report["checks"]) and all(c["ok"] for c in report["checks"].values())
        text = json.dumps(report, indent=2, default=str)
        Path(args.out, "gpu_check.json").write_text(text)
        print(text)
        print(f"verdicts: {sum(c['ok'] for c in report['checks'].values())} of {len(report['checks'])} passed")


if __name__ == "__main__":
    main()
