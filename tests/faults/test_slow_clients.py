"""Slow clients: one that never reads its stream, one that sends its body a byte a second, one
whose body never ends.

None holds an engine slot for long.  Under uvicorn (the default) a stream nobody reads fills the
connection's buffer and the stream waits; after ``service.stream_write_timeout_seconds`` without
room the stream is ended and its request cancelled (models_app/api/client_timeouts.py).  Under
daphne (Twisted) the application's writes never wait, so the stream runs to its end (bounded by
max_output_tokens) and frees its slot.  A body that trickles in occupies a connection, never the
pool, and one that has not arrived after ``service.request_body_timeout_seconds`` is answered 408
``request_body_timeout``.
"""
from __future__ import annotations

import json
import socket
import time

import pytest

from tests.conftest import TEST_SERVER, model_entry, service_with_loaded_models, wait_until

WORDS = 40_000  # about 6 MB of SSE events: more than the loopback socket buffers hold
FAST_TIMEOUTS = {"stream_write_timeout_seconds": 2, "request_body_timeout_seconds": 3}
# daphne (Twisted) reads the whole body before it calls the application: the bound never starts.
uvicorn_only = pytest.mark.skipif(TEST_SERVER == "daphne", reason="daphne calls the application after the body")


def raw_post(port: int, body: bytes, *, send_body: bool = True, length: int | None = None) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    head = (f"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n\r\n").encode()
    sock.sendall(head + (body if send_body else b""))
    return sock


def test_a_stream_nobody_reads_frees_its_engine_slot(tmp_path):
    reply = " ".join(f"w{i}" for i in range(WORDS))
    models = {"m": {"backend": "stub", "stub_reply": reply}}  # one slot: target_inflight 1
    with service_with_loaded_models(tmp_path, models, service=FAST_TIMEOUTS) as live:
        body = json.dumps({"model": "m", "input": "x", "stream": True, "max_output_tokens": WORDS + 10}).encode()
        stalled = raw_post(live.port, body)  # never read from
        try:
            with live.client() as http:
                assert wait_until(lambda: model_entry(http, "m")["inflight_requests"] == 1, 10)
                freed = wait_until(lambda: model_entry(http, "m")["inflight_requests"] == 0, 20)
                assert freed, "the slot of an unread stream was not freed within 20 s"
                answer = http.post("/v1/responses", json={"model": "m", "input": "x", "max_output_tokens": 3})
                assert answer.status_code == 200, answer.text
                assert answer.json()["status"] in ("completed", "incomplete")
        finally:
            stalled.close()


def test_a_body_sent_a_byte_a_second_holds_no_engine_slot(tmp_path):
    models = {"m": {"backend": "stub"}}
    with service_with_loaded_models(tmp_path, models, service={"request_body_timeout_seconds": 30}) as live:
        body = json.dumps({"model": "m", "input": "slow"}).encode()
        trickle = raw_post(live.port, body, send_body=False)
        try:
            with live.client() as http:
                for byte in body[:4]:  # four seconds of a body arriving a byte a second
                    trickle.sendall(bytes([byte]))
                    assert model_entry(http, "m")["inflight_requests"] == 0
                    answer = http.post("/v1/responses", json={"model": "m", "input": "meanwhile"})
                    assert answer.status_code == 200, answer.text
                    time.sleep(1)
                trickle.sendall(body[4:])
                trickle.settimeout(10)
                assert trickle.recv(64).startswith(b"HTTP/1.1 200")
        finally:
            trickle.close()


def read_all(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except OSError:
        pass
    return b"".join(chunks)


@uvicorn_only
def test_a_body_that_never_arrives_is_answered_408_and_the_service_serves_on(tmp_path):
    models = {"m": {"backend": "stub"}}
    with service_with_loaded_models(tmp_path, models, service=FAST_TIMEOUTS) as live:
        began = time.monotonic()
        stuck = raw_post(live.port, b'{"model": "m", "in', length=1000)  # 1,000 bytes promised, 18 sent
        try:
            answer = read_all(stuck, 15)
        finally:
            stuck.close()
        waited = time.monotonic() - began
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        envelope = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert envelope["error"]["code"] == "request_body_timeout"
        assert "request_body_timeout_seconds" in envelope["error"]["message"]
        assert 2.5 < waited < 12, waited
        with live.client() as http:
            assert model_entry(http, "m")["inflight_requests"] == 0
            assert http.post("/v1/responses", json={"model": "m", "input": "after"}).status_code == 200


@uvicorn_only
def test_an_admin_body_that_never_arrives_is_answered_408_too(tmp_path):
    """The bound covers every HTTP path, the Django-served admin API as well."""
    with service_with_loaded_models(tmp_path, {"m": {"backend": "stub"}}, service=FAST_TIMEOUTS) as live:
        sock = socket.create_connection(("127.0.0.1", live.port))
        try:
            sock.sendall(b"POST /v1/admin/reload HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{")
            answer = read_all(sock, 15)
        finally:
            sock.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"request_body_timeout"' in answer
