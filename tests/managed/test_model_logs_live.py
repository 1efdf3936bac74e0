"""GET /v1/admin/models/{name}/logs on a live service: a managed server's output, its tail and its
follow (SSE), the new lines of a request arriving on the open stream."""
import json
import threading

import httpx

from tests.managed.test_managed_live import fake_model


def test_the_tail_and_the_follow_of_a_managed_server(live_service, fake_bin, tmp_path):
    service_env = {"LLMPOOL_STATE_DIR": str(tmp_path / "state")}
    service = live_service({"m": fake_model("sglang_serve", fake_bin, tmp_path), "n": {"backend": "stub"}},
                           env=service_env)
    with service.client() as http:
        assert http.post("/v1/admin/models/m/load").json()["runtime_state"] == "loaded"
        tail = http.get("/v1/admin/models/m/logs").json()
        [replica] = tail["replicas"]
        assert (tail["model"], replica["replica"], replica["kind"], replica["running"]) == (
            "m", 0, "managed_server", True)
        assert any(line.startswith("INFO listening on 127.0.0.1") for line in replica["lines"]), replica
        assert replica["next"] >= len(replica["lines"])
        one = http.get("/v1/admin/models/m/logs", params={"lines": 1}).json()["replicas"][0]
        assert one["lines"] == replica["lines"][-1:]
        assert http.get("/v1/admin/models/n/logs").json() == {"model": "n", "replicas": []}
        bad = http.get("/v1/admin/models/m/logs", params={"lines": "0"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "lines"
        assert http.get("/v1/admin/models/nope/logs").json()["error"]["code"] == "unknown_model"

        lines = []
        with httpx.stream("GET", service.url + "/v1/admin/models/m/logs", params={"follow": "true"},
                          timeout=20) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            for line in stream.iter_lines():
                if not line.startswith("data: "):
                    continue
                lines.append(json.loads(line.removeprefix("data: "))["line"])
                if len(lines) == len(replica["lines"]):  # the tail: now a request writes new lines
                    request = threading.Thread(target=httpx.post, args=(service.url + "/v1/responses",),
                                               kwargs={"json": {"model": "m", "input": "x"}, "timeout": 20})
                    request.start()
                if lines[-1].startswith("HTTP "):
                    break
        request.join(timeout=20)
    assert lines[: len(replica["lines"])] == replica["lines"]
    assert "x" not in lines[-1].split()  # the fake's access line, without the request's text
