"""The bounds llm-pool's uvicorn protocol puts on connections (models_app/http/connections.py), on a real
socket and uvloop, as ``manage.py serve`` and ``manage.py api`` run it, with a small ASGI app in
front of it: the head timeout (from the connection's start, from a later request's first byte,
never while the server still answers the request before), the cap on connections, and the
keep-alive close that never drops a request already received.  tests/faults/test_connection_bounds.py checks the same
bounds on a live service, set from settings.json."""
from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import uvicorn
import uvloop
from websockets.sync.client import connect

from models_app.http.connections import ConnectionLimits, RefusalLog, bounded_httptools_protocol
from tests.conftest import free_port

GET = b"GET / HTTP/1.1\r\nHost: test\r\n\r\n"


async def app(scope, receive, send) -> None:
    """200 ``ok``, after a second for ``/slow``; ``/busy`` answers, then keeps the event loop busy
    as a loaded process would (``busy_loop``); a WebSocket echoes."""
    if scope["type"] == "websocket":
        await echo(receive, send)
        return
    await receive()
    if scope["path"] == "/busy":
        busy_loop(asyncio.get_running_loop())
    elif scope["path"] == "/slow":
        await asyncio.sleep(1)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def echo(receive, send) -> None:
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    while (message := await receive())["type"] == "websocket.receive":
        await send({"type": "websocket.send", "text": message["text"]})


def busy_loop(loop) -> None:
    """From 0.1 s to 0.3 s a callback holds the loop, so the keep-alive timer (0.2 s after the
    answer) and a timer due just before it (0.19 s) are both expired at the next turn's timers.
    That one holds the loop until 1.3 s: a request the client sends meanwhile is in the kernel,
    unread, when the keep-alive timer runs, as under CPU load."""
    loop.call_later(0.1, loop.call_soon, time.sleep, 0.2)
    loop.call_later(0.19, time.sleep, 1.0)


@contextmanager
def serving(*, head_timeout: float = 10.0, keep_alive: float = 20.0, max_connections: int = 100) -> Iterator[int]:
    """``app`` served on a free port by uvicorn with llm-pool's protocol, in a thread of its own."""
    limits = ConnectionLimits(head_timeout=head_timeout, keep_alive_timeout=keep_alive, max_connections=max_connections)
    config = uvicorn.Config(app, port=free_port(), loop="none", http=bounded_httptools_protocol(limits),
                            ws="websockets-sansio", lifespan="off", log_config=None, timeout_keep_alive=keep_alive)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=uvloop.run, args=(server.serve(),), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
            time.sleep(0.01)
        yield config.port
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def answer(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """What the server sends until it has sent a whole answer (``ok``) or closed."""
    sock.settimeout(timeout)
    received = b""
    while not received.endswith(b"ok"):
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:
            return received + b"<reset>"
        if not chunk:
            break
        received += chunk
    return received


def test_a_request_received_while_the_loop_was_busy_is_answered_when_the_keep_alive_runs_out():
    with serving(keep_alive=0.2) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /busy HTTP/1.1\r\nHost: test\r\n\r\n")
        assert answer(sock).startswith(b"HTTP/1.1 200")
        time.sleep(0.6)  # while the loop is held, past the keep-alive's 0.2 s
        sock.sendall(GET)
        assert answer(sock).startswith(b"HTTP/1.1 200")


def test_an_idle_connection_is_closed_when_the_keep_alive_runs_out():
    with serving(keep_alive=0.3) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(GET)
        assert answer(sock).startswith(b"HTTP/1.1 200")
        began = time.monotonic()
        assert answer(sock) == b""
        assert 0.2 < time.monotonic() - began < 3


def test_a_later_request_is_timed_from_its_first_byte():
    """A connection kept alive longer than the head timeout still serves its next request; that
    request's head, begun and not finished, is answered 408 once the timeout passes."""
    with serving(head_timeout=0.5, keep_alive=5) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(GET)
        assert answer(sock).startswith(b"HTTP/1.1 200")
        time.sleep(0.8)
        sock.sendall(GET)
        assert answer(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET / HTTP/1.1\r\nHo")
        began = time.monotonic()
        refused = answer(sock)
        assert refused.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), refused
        assert b'"code":"request_head_timeout"' in refused
        assert 0.4 < time.monotonic() - began < 3


def test_a_pipelined_head_waits_for_the_answer_before_it_without_a_timeout():
    """The server answers the first request for a second; the second's head, begun meanwhile, is
    timed from when the server is free to read it: the first answer comes whole, then the 408."""
    with serving(head_timeout=0.3) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: test\r\n\r\nGET / HTTP/1.1\r\nHo")
        first = answer(sock)
        assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"ok"), first
        refused = answer(sock)
        assert refused.startswith(b"HTTP/1.1 408"), refused


@pytest.mark.parametrize("sent", [b"", b"POST /v1/responses HTTP/1.1\r\nContent-"])
def test_a_first_head_is_timed_from_the_connection_start(sent):
    """Nothing sent: closed unanswered, as an idle connection; a head begun: 408 and closed."""
    with serving(head_timeout=0.5) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        began = time.monotonic()
        sock.sendall(sent)
        received = answer(sock)
        assert 0.4 < time.monotonic() - began < 3
        if sent:
            assert received.startswith(b"HTTP/1.1 408"), received
        else:
            assert received == b""


def test_the_connection_over_the_cap_is_answered_503_and_a_freed_place_serves_again():
    with serving(max_connections=2) as port:
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        for sock in held:  # answered, so accepted, and kept alive
            sock.sendall(GET)
            assert answer(sock).startswith(b"HTTP/1.1 200")
        with socket.create_connection(("127.0.0.1", port)) as over:
            refused = answer(over)
        assert refused.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), refused
        assert b"retry-after: 1\r\n" in refused and b"connection: close\r\n" in refused
        assert b'"code":"too_many_connections"' in refused
        held.pop().close()
        time.sleep(0.1)  # the server saw the close
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(GET)
            assert answer(sock).startswith(b"HTTP/1.1 200")
        for sock in held:
            sock.close()


def test_a_websocket_outlives_the_head_timeout_of_its_upgrade_request():
    with serving(head_timeout=0.3) as port, connect(f"ws://127.0.0.1:{port}/ws") as websocket:
        time.sleep(0.6)
        websocket.send("still here")
        assert websocket.recv(timeout=5) == "still here"


def test_refused_connections_are_logged_once_a_minute_with_their_count(caplog):
    refusals = RefusalLog(max_connections=4)
    with caplog.at_level(logging.WARNING, logger="llmpool.http"):
        for now in (100.0, 100.5, 130.0, 160.0, 161.0):
            refusals.refused_one(now)
    assert [record.getMessage() for record in caplog.records] == [
        "1 connection(s) refused with 503 too_many_connections: 4 are open (service.max_connections)",
        "3 connection(s) refused with 503 too_many_connections: 4 are open (service.max_connections)",
    ]
