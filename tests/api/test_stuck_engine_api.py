"""A stuck engine over HTTP: a chat request that blocks its engine process for good gets 504
``request_timeout``; the process is killed once the 5 s grace of the cancel is over, a
``replica_failed`` event names it, and the model serves on its other replica."""
from __future__ import annotations

from tests.admin_ui.helpers import EventStream
from tests.conftest import model_entry

STUCK = {"backend": "stub", "isolation": "process", "replicas": 2, "stub_reply": "fine",
         "stub_spin_on": "loop forever", "request_timeout_seconds": 1}


def chat(http, text: str):
    return http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": text}]})


def test_a_stuck_replica_is_killed_and_the_model_serves_on(live_service):
    service = live_service({"m": STUCK})
    with service.client(timeout=60) as http:
        assert http.post("/v1/admin/models/m/load").json()["loaded_replicas"] == 2
        with EventStream(service) as events:
            timed_out = chat(http, "please loop forever")
            assert timed_out.status_code == 504
            assert timed_out.json()["error"]["code"] == "request_timeout"
            name, event = events.next_event()
        assert (name, event["model"], event["replica"], event["reason"]) == ("replica_failed", "m", 1, "engine_failure")
        assert "died of SIGKILL while loaded (killed: it did not stop within 5 s of a cancel" in event["error"]
        answers = [chat(http, "hello") for _ in range(3)]
        assert [a.json()["choices"][0]["message"]["content"] for a in answers] == ["fine"] * 3
        entry = model_entry(http, "m")
        assert (entry["runtime_state"], entry["loaded_replicas"], entry["replicas"]) == ("loaded", 1, 2)
        assert entry["last_error"] == event["error"]
