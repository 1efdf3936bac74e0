"""A cold start over HTTP: three 400 MiB models that load on request on a cpu budget where two
fit, with ``idle_lru``.  The request for the third, sent while the first two load, waits for
them and evicts one instead of getting 409 ``insufficient_memory``."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tests.conftest import model_entry, wait_until

COLD = {"backend": "stub", "device": "cpu", "stub_vram_mib": 400, "stub_load_seconds": 1.0,
        "load_on_request": True, "stub_reply": "ready"}
MEMORY = {"devices": {"cpu": {"budget_mib": 1000}}, "eviction": "idle_lru"}


def test_a_request_blocked_by_loads_under_way_waits_and_is_answered(live_service):
    service = live_service({name: COLD for name in ("a", "b", "c")}, local={"memory": MEMORY})
    with service.client(timeout=60) as http, ThreadPoolExecutor(3) as pool:

        def ask(model: str):
            return http.post("/v1/chat/completions",
                             json={"model": model, "messages": [{"role": "user", "content": "hi"}]})

        first = [pool.submit(ask, name) for name in ("a", "b")]
        assert wait_until(lambda: all(model_entry(http, n)["runtime_state"] == "loading" for n in ("a", "b")))
        third = pool.submit(ask, "c")
        answers = [future.result() for future in (*first, third)]
        assert [answer.status_code for answer in answers] == [200, 200, 200], [a.text for a in answers]
        assert {answer.json()["choices"][0]["message"]["content"] for answer in answers} == {"ready"}
        entries = {name: model_entry(http, name) for name in ("a", "b", "c")}
    assert entries["c"]["runtime_state"] == "loaded"
    evicted = [name for name in ("a", "b") if entries[name]["runtime_state"] == "unloaded"]
    assert len(evicted) == 1 and entries[evicted[0]]["last_reason"] == "memory_eviction"
