"""The embedded default end to end: list, load, respond, unload over real HTTP."""


def test_load_respond_unload(live_service):
    service = live_service({"echo": {"backend": "stub", "stub_token_delay_ms": 1}})
    with service.client() as http:
        listed = http.get("/v1/admin/models").json()["models"]
        assert [(m["name"], m["runtime_state"]) for m in listed] == [("echo", "unloaded")]
        loaded = http.post("/v1/admin/models/echo/load")
        assert loaded.status_code == 200
        assert loaded.json()["runtime_state"] == "loaded"
        answer = http.post("/v1/responses", json={"model": "echo", "input": "ping pong"})
        assert answer.status_code == 200
        assert answer.json()["output"][0]["content"][0]["text"] == "ping pong"
        unloaded = http.post("/v1/admin/models/echo/unload")
        assert unloaded.json()["runtime_state"] == "unloaded"
    assert service.stop() == 0
