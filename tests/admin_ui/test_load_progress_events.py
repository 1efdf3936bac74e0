"""Load progress over HTTP: the entry's load_progress and GET /v1/admin/events?progress=true."""
from __future__ import annotations

import json
import threading

import httpx

from tests.admin_ui.helpers import AUTH


def read_events(lines, until_model: str, until_to: str) -> list[tuple[str, dict]]:
    """Events of an open stream's lines until ``until_model``'s transition to ``until_to``."""
    found, name, data = [], None, []
    for line in lines:
        if line.startswith(":"):
            continue
        if line == "":
            if name is not None:
                found.append((name, json.loads("\n".join(data))))
                if name == "transition" and found[-1][1]["model"] == until_model and found[-1][1]["to"] == until_to:
                    return found
            name, data = None, []
            continue
        field, _, value = line.partition(": ")
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
    raise AssertionError("the stream ended")


def test_a_slow_stub_load_streams_rising_progress_then_loaded(embedded_workbench):
    service = embedded_workbench
    with httpx.Client(base_url=service.url, timeout=httpx.Timeout(15, read=10), headers=AUTH) as http:
        with http.stream("GET", "/v1/admin/events?progress=true", headers={"Accept": "text/event-stream"}) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith(":")
            answers = []
            loading = threading.Thread(target=lambda: answers.append(
                httpx.post(service.url + "/v1/admin/models/stub-slow/load", headers=AUTH, timeout=30)))
            loading.start()
            events = read_events(lines, "stub-slow", "loaded")
            loading.join(30)
        try:
            assert answers[0].status_code == 200 and answers[0].json()["load_progress"] is None
            names = [name for name, _ in events]
            first, last = names.index("transition"), len(names) - 1
            progress = [data for name, data in events[first:last] if name == "load_progress"]
            assert len(progress) >= 3 and all(set(item) == {"model", "load_progress", "at"} for item in progress)
            assert {item["model"] for item in progress} == {"stub-slow"}
            assert {item["load_progress"]["stage"] for item in progress} == {"stub_loading"}
            fractions = [item["load_progress"]["fraction"] for item in progress]
            assert fractions == sorted(fractions) and 0 <= fractions[0] < fractions[-1] <= 1.0
        finally:
            assert http.post("/v1/admin/models/stub-slow/unload").status_code == 200


def test_progress_other_than_true_or_false_is_400(embedded_workbench):
    answer = httpx.get(embedded_workbench.url + "/v1/admin/events?progress=maybe", headers=AUTH, timeout=10)
    assert answer.status_code == 400
    assert (answer.json()["error"]["code"], answer.json()["error"]["param"]) == ("invalid_request", "progress")
