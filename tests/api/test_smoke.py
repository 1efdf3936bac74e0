"""The embedded default end to end: list, load, respond, unload over real HTTP; the stack dump."""
import signal

from tests.conftest import wait_until


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


def test_sigusr1_writes_every_stack_to_the_log(live_service):
    service = live_service({"echo": {"backend": "stub"}})
    processes = [p for p in (service.runtime_process, service.process) if p is not None]
    for process in processes:
        process.send_signal(signal.SIGUSR1)
    dumped = wait_until(lambda: service.log().count("--- end of the stacks ---") == len(processes), timeout=5)
    assert dumped, service.log()[-3000:]
    log = service.log()
    assert "--- SIGUSR1: the stacks of process" in log
    assert "Current thread" in log or "Thread 0x" in log  # faulthandler's thread stacks
    assert "task " in log and " at /" in log  # at least one asyncio task's await chain
    assert all(process.poll() is None for process in processes)  # the dump changes nothing
    assert service.stop() == 0
