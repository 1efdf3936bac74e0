"""A bounded soak: 5,000 mixed requests across stub models, each with a fairness key of its own, and
loads/unloads in between; the service's RSS and open file descriptors at the end stay within 5 % of
what they were after a warm-up (no per-key, per-request or per-load state kept)."""
from __future__ import annotations

import json
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.conftest import model_entry, service_with_loaded_models

MODELS = {
    "a": {"backend": "stub", "target_inflight": 4},
    "b": {"backend": "stub", "target_inflight": 4},
    "e": {"backend": "stub", "embeddings": True},
    "cold": {"backend": "stub"},  # loaded and unloaded between the batches
}
BATCH = 200
WARM_UP_BATCHES = 3
SOAK_BATCHES = 25  # 5,000 requests


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def one_request(http: httpx.Client, index: int) -> int:
    key = uuid.uuid4().hex  # a fairness key never seen again
    headers = {"X-LLMPool-Fairness-Key": key}
    kind = index % 5
    if kind == 0:
        answer = http.post("/v1/responses", json={"model": "a", "input": f"hello {index}"}, headers=headers)
    elif kind == 1:
        with http.stream("POST", "/v1/responses", headers=headers,
                         json={"model": "b", "input": f"stream {index}", "stream": True}) as answer:
            events = [line for line in answer.iter_lines() if line.startswith("data: ")]
            assert json.loads(events[-1].removeprefix("data: "))["type"] == "response.completed"
    elif kind == 2:
        answer = http.post("/v1/chat/completions", json={
            "model": "a", "messages": [{"role": "user", "content": f"chat {index}"}], "user": key})
    elif kind == 3:
        answer = http.post("/v1/completions", json={"model": "b", "prompt": f"raw {index}", "user": key})
    else:
        answer = http.post("/v1/embeddings", json={"model": "e", "input": [f"embed {index}"]}, headers=headers)
    return answer.status_code


def batch(http: httpx.Client, pool: ThreadPoolExecutor, start: int) -> None:
    codes = list(pool.map(lambda index: one_request(http, index), range(start, start + BATCH)))
    assert codes == [200] * BATCH, sorted(set(codes))
    assert http.post("/v1/admin/models/cold/load").json()["runtime_state"] == "loaded"
    assert http.post("/v1/responses", json={"model": "cold", "input": "x"}).status_code == 200
    assert http.post("/v1/admin/models/cold/unload").json()["runtime_state"] == "unloaded"


def test_soak_keeps_rss_and_file_descriptors_flat(tmp_path):
    with service_with_loaded_models(tmp_path, MODELS) as live, live.client(timeout=60) as http, \
            ThreadPoolExecutor(8) as pool:
        pid = live.process.pid
        for number in range(WARM_UP_BATCHES):
            batch(http, pool, number * BATCH)
        warm_rss, warm_fds = rss_kib(pid), open_fds(pid)
        for number in range(WARM_UP_BATCHES, WARM_UP_BATCHES + SOAK_BATCHES):
            batch(http, pool, number * BATCH)
        end_rss, end_fds = rss_kib(pid), open_fds(pid)
        figures = {"requests": SOAK_BATCHES * BATCH, "warm_rss_kib": warm_rss, "end_rss_kib": end_rss,
                   "warm_fds": warm_fds, "end_fds": end_fds}
        print("soak", json.dumps(figures))
        assert end_rss <= warm_rss * 1.05, figures
        assert end_fds <= warm_fds * 1.05, figures
        for name in ("a", "b", "e"):
            assert model_entry(http, name)["runtime_state"] == "loaded"
        assert model_entry(http, "cold")["runtime_state"] == "unloaded"
