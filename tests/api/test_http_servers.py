"""Both HTTP servers serve llm-pool in both shapes (models_app/http/server.py): uvicorn, the default,
and daphne (``--server daphne``); and uvicorn's graceful stop lets a stream in flight finish.
"""
from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from tests.conftest import LiveService, write_settings

MODELS = {"m": {"backend": "stub", "enabled": True, "stub_reply": "one two three four five six"}}


@pytest.mark.parametrize("server", ["uvicorn", "daphne"])
def test_each_server_serves_chat_streams_and_the_admin_api_and_stops_cleanly(tmp_path, server):
    """In both shapes: tests/api runs every module embedded and split."""
    live = LiveService(write_settings(tmp_path, MODELS), tmp_path / "db.sqlite3", server=server).start()
    try:
        with live.client() as http:
            assert http.get("/healthz").json()["status"] == "ok"
            answer = http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["message"]["content"] == "one two three four five six"
            with http.stream("POST", "/v1/chat/completions", json={
                    "model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as stream:
                assert stream.headers["content-type"].startswith("text/event-stream")
                lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
            assert lines[-1] == "data: [DONE]"
            text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or "" for line in lines[:-1])
            assert text == "one two three four five six"
            assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["m"]
            assert http.get("/v1/admin/models").json()["models"][0]["runtime_state"] == "loaded"
    finally:
        assert live.stop() == 0, live.log()


def test_uvicorn_lets_a_stream_in_flight_finish_on_sigterm(tmp_path):
    """SIGTERM: no new connections, the stream already running ends normally within the grace
    period, then the runtime stops and the process exits 0."""
    slow = {"m": {"backend": "stub", "enabled": True, "stub_reply": " ".join(["w"] * 15), "stub_token_delay_ms": 100}}
    live = LiveService(write_settings(tmp_path, slow), tmp_path / "db.sqlite3", server="uvicorn").start()
    received: list[str] = []
    try:
        with httpx.Client(base_url=live.url, timeout=30) as http:
            with http.stream("POST", "/v1/chat/completions", json={
                    "model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as stream:
                lines = stream.iter_lines()
                received.append(next(line for line in lines if line.startswith("data: ")))
                stopping = threading.Thread(target=live.process.send_signal, args=(signal.SIGTERM,))
                stopping.start()
                time.sleep(0.3)
                with pytest.raises(httpx.ConnectError):  # the listening socket is closed
                    httpx.get(live.url + "/healthz", timeout=2)
                received += [line for line in lines if line.startswith("data: ")]
        assert received[-1] == "data: [DONE]"
        text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or "" for line in received[:-1])
        assert text == " ".join(["w"] * 15)
        assert live.process.wait(timeout=20) == 0
    finally:
        live.stop()
