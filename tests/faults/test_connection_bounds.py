"""Clients that hold connections: heads sent a byte a second (slowloris), connections that send
nothing, more connections than the service takes; and clients that reuse an idle connection.  Under uvicorn (models_app/http/connections.py) a
request head must arrive within ``service.http_head_timeout_seconds`` (else 408
``request_head_timeout`` and the close), and at most ``service.max_connections`` connections are
open (the next is answered 503 ``too_many_connections`` and closed), so requests on other
connections go on being served.  Between requests a connection stays open
``service.http_keep_alive_timeout_seconds``, longer than the common clients keep an idle one, so
none sends a request on a connection the service is closing (which drops it unanswered).
Daphne has none of these bounds (docs/deployment.md).
"""
from __future__ import annotations

import http.client
import json
import resource
import socket
import subprocess
import time

import httpx
import pytest

from tests.conftest import ROOT, TEST_SERVER, LiveService, wait_until, write_settings
from tests.faults.test_slow_clients import read_all

MODELS = {"m": {"backend": "stub", "enabled": True}}
# How long httpx (and the openai SDK, built on it) reuses an idle connection: httpx.Limits().
CLIENT_IDLE_EXPIRY_SECONDS = 5.0
BODY = {"model": "m", "input": "meanwhile"}
uvicorn_only = pytest.mark.skipif(TEST_SERVER == "daphne", reason="the bounds are uvicorn's (models_app/http/connections.py)")
pytestmark = uvicorn_only


def trickling(port: int, count: int) -> list[socket.socket]:
    """``count`` connections, each with the start of a request head and no end to it."""
    heads = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        heads.append(sock)
    return heads


def trickle_one_byte(heads: list[socket.socket]) -> None:
    for sock in heads:
        try:
            sock.sendall(b"a")
        except OSError:
            pass  # closed by the server


def envelope(answer: bytes) -> dict:
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]


def test_a_head_sent_a_byte_a_second_is_answered_408_and_closed(live_service):
    live = live_service(MODELS, service={"http_head_timeout_seconds": 2})
    [head] = trickling(live.port, 1)
    try:
        began = time.monotonic()
        head.settimeout(0.5)
        answer = b""
        while time.monotonic() - began < 15:
            try:
                chunk = head.recv(65536)
            except TimeoutError:
                head.sendall(b"a")  # one more byte of the header's value: the head never ends
                continue
            if not chunk:
                break
            answer += chunk
        waited = time.monotonic() - began
    finally:
        head.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    error = envelope(answer)
    assert error["code"] == "request_head_timeout" and "service.http_head_timeout_seconds" in error["message"]
    assert 1.5 < waited < 8, waited
    with live.client() as http:
        assert http.post("/v1/responses", json=BODY).status_code == 200


def test_requests_are_served_while_heads_trickle_in_on_forty_other_connections(live_service):
    live = live_service(MODELS, service={"http_head_timeout_seconds": 60})
    heads = trickling(live.port, 40)
    try:
        with live.client() as http:
            for _ in range(10):
                trickle_one_byte(heads)
                answer = http.post("/v1/responses", json=BODY)
                assert answer.status_code == 200, answer.text
        for sock in heads:
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):  # nothing received: still open, unanswered
                sock.recv(1)
    finally:
        for sock in heads:
            sock.close()


@pytest.mark.parametrize("mode", ["embedded", "split"])
def test_a_connection_over_max_connections_is_answered_503_and_the_service_serves_again_once_one_closes(
        live_service, mode):
    live = live_service(MODELS, service={"max_connections": 4}, mode=mode)
    held = [http.client.HTTPConnection("127.0.0.1", live.port, timeout=10) for _ in range(4)]
    try:
        assert [healthz(connection) for connection in held] == [200] * 4  # four open, kept alive
        refused = httpx.post(live.url + "/v1/responses", json=BODY, timeout=10)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "too_many_connections"
        assert refused.headers["retry-after"] == "1"
        held.pop().close()
        served = wait_until(lambda: httpx.post(live.url + "/v1/responses", json=BODY, timeout=10).status_code == 200, 5)
        assert served
    finally:
        for connection in held:
            connection.close()


class ServiceWithFewFiles(LiveService):
    """An embedded service whose process may open ``FILE_LIMIT`` files (sockets included)."""

    FILE_LIMIT = 72

    def _spawn(self, *args: str) -> subprocess.Popen:
        def limit_files() -> None:
            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.FILE_LIMIT, hard))

        log = open(self.log_path, "ab")
        return subprocess.Popen(list(args), cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=limit_files)


def test_with_72_files_64_slow_heads_get_clean_refusals_and_then_the_service_serves(tmp_path):
    """The default max_connections is half the file limit: the slow heads past it, and requests
    while they hold the rest, are answered 503 too_many_connections (never reset or left hanging);
    once the heads time out, every request is served."""
    settings = write_settings(tmp_path, MODELS, service={"http_head_timeout_seconds": 3})
    live = ServiceWithFewFiles(settings, tmp_path / "db.sqlite3", mode="embedded").start()
    heads: list[socket.socket] = []
    try:
        heads = trickling(live.port, 64)
        statuses = []
        for _ in range(10):
            answer = httpx.post(live.url + "/v1/responses", json=BODY, timeout=10)
            assert answer.status_code in (200, 503), answer.text
            if answer.status_code == 503:
                assert answer.json()["error"]["code"] == "too_many_connections"
            statuses.append(answer.status_code)
        refused = [sock for sock in heads if read_all(sock, 0.05).startswith(b"HTTP/1.1 503")]
        assert len(refused) == 64 - ServiceWithFewFiles.FILE_LIMIT // 2, len(refused)
        time.sleep(3.5)  # the heads' timeout
        statuses_after = [httpx.post(live.url + "/v1/responses", json=BODY, timeout=10).status_code for _ in range(10)]
        assert statuses_after == [200] * 10, (statuses, statuses_after)
    finally:
        for sock in heads:
            sock.close()
        assert live.stop() == 0, live.log()[-3000:]


def test_an_idle_connection_stays_open_longer_than_clients_reuse_one(live_service):
    """A client reuses a connection idle up to its expiry: the service must not be closing it then."""
    assert httpx.Limits().keepalive_expiry == CLIENT_IDLE_EXPIRY_SECONDS
    live = live_service(MODELS)
    connection = http.client.HTTPConnection("127.0.0.1", live.port, timeout=10)
    try:
        assert healthz(connection) == 200
        opened = connection.sock
        time.sleep(CLIENT_IDLE_EXPIRY_SECONDS + 1)
        assert healthz(connection) == 200  # http.client sends it on the same socket, open or not
        assert connection.sock is opened
    finally:
        connection.close()


def healthz(connection: http.client.HTTPConnection) -> int:
    connection.request("GET", "/healthz")
    answer = connection.getresponse()
    answer.read()
    return answer.status
