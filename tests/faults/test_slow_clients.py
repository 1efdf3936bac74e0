"""Slow clients: one that never reads its stream, one that sends its body a byte a second.

Neither holds an engine slot: daphne (Twisted) takes whatever the application sends into the
connection's write buffer without waiting for the client, so a stream nobody reads still runs to
its end (bounded by max_output_tokens) and frees its slot; and the ASGI application is called only
once the whole body has arrived, so a body that trickles in occupies a connection, not the pool.
"""
from __future__ import annotations

import json
import socket
import time

from tests.conftest import model_entry, service_with_loaded_models, wait_until

WORDS = 40_000  # about 6 MB of SSE events: more than the loopback socket buffers hold


def raw_post(port: int, body: bytes, *, send_body: bool = True) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    head = (f"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sock.sendall(head + (body if send_body else b""))
    return sock


def test_a_stream_nobody_reads_frees_its_engine_slot(tmp_path):
    reply = " ".join(f"w{i}" for i in range(WORDS))
    models = {"m": {"backend": "stub", "stub_reply": reply}}  # one slot: target_inflight 1
    with service_with_loaded_models(tmp_path, models) as live:
        body = json.dumps({"model": "m", "input": "x", "stream": True, "max_output_tokens": WORDS + 10}).encode()
        stalled = raw_post(live.port, body)  # never read from
        try:
            with live.client() as http:
                freed = wait_until(lambda: model_entry(http, "m")["inflight_requests"] == 0, 30)
                assert freed, "the slot of an unread stream was not freed within 30 s"
                answer = http.post("/v1/responses", json={"model": "m", "input": "x", "max_output_tokens": 3})
                assert answer.status_code == 200, answer.text
                assert answer.json()["status"] in ("completed", "incomplete")
        finally:
            stalled.close()


def test_a_body_sent_a_byte_a_second_holds_no_engine_slot(tmp_path):
    models = {"m": {"backend": "stub"}}
    with service_with_loaded_models(tmp_path, models) as live:
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
