"""uvicorn as llm-pool runs it (models_app.http.connections.bounded_httptools_protocol) sends a response's
head with its body in one write (``HeadWithBody``): one segment and one wake-up of the client for a
JSON answer.  uvicorn's own protocol class is driven here over a transport that records each write."""
from __future__ import annotations

import asyncio

import uvicorn
from uvicorn.server import ServerState

from models_app.http.connections import HeadWithBody, bounded_httptools_protocol


class RecordingTransport(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def served(app, request: bytes) -> RecordingTransport:
    """``request`` sent to ``app`` through llm-pool's uvicorn protocol; the writes once answered."""
    config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False)
    config.load()
    protocol = bounded_httptools_protocol()(config, ServerState(), {}, asyncio.get_running_loop())
    transport = RecordingTransport()
    protocol.connection_made(transport)
    protocol.data_received(request)
    for _ in range(200):
        if protocol.cycle is not None and (protocol.cycle.response_complete or transport.closed):
            break
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.01)  # anything written after the end (nothing should be)
    protocol.connection_lost(None)
    return transport


POST = b"POST /v1/x HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def test_a_json_answer_goes_out_in_one_write():
    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"11")]})
        await send({"type": "http.response.body", "body": b'{"a": true}'})

    transport = await served(app, POST)
    [write] = transport.writes
    assert write.startswith(b"HTTP/1.1 200 OK\r\n") and write.endswith(b'\r\n\r\n{"a": true}')


async def test_a_stream_gets_its_head_at_once_and_each_event_as_it_comes():
    heads_alone = []

    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await asyncio.sleep(0.02)  # the first event comes later: the head must not wait for it
        heads_alone.append(list(transport_of(send)))
        for event in (b"data: 1\n\n", b"data: 2\n\n"):
            await send({"type": "http.response.body", "body": event, "more_body": True})
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    transport = await served(app, POST)
    [before_the_first_event] = heads_alone
    assert len(before_the_first_event) == 1 and before_the_first_event[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.writes[1:] == [b"9\r\ndata: 1\n\n\r\n", b"9\r\ndata: 2\n\n\r\n", b"0\r\n\r\n"]


def transport_of(send) -> list[bytes]:
    """The writes so far of the transport behind uvicorn's ``send`` (a bound method of its cycle)."""
    return send.__self__.transport._transport.writes


async def test_a_response_that_never_sends_its_body_still_gets_its_head_then_the_close():
    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
        # returns without the body: uvicorn closes the connection

    transport = await served(app, POST)
    assert transport.closed
    assert len(transport.writes) == 1 and transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")


async def test_a_head_held_for_a_connection_that_closed_meanwhile_is_dropped():
    """The client left within the turn the head was held in: nothing is written to the closed
    transport (uvloop raises on such a write, which the loop would log as a failed callback)."""

    class Cycle:
        response_started = True

    transport = RecordingTransport()
    held = HeadWithBody(Cycle(), transport, asyncio.get_running_loop())
    held.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.close()  # the connection is lost before the end of the turn
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert transport.writes == []


async def test_100_continue_is_not_held():
    seen_before_the_answer = []

    async def app(scope, receive, send):
        message = await receive()  # asks for the body: uvicorn says 100 Continue first
        seen_before_the_answer.append(list(transport_of(send)))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": message["body"]})

    config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False)
    config.load()
    protocol = bounded_httptools_protocol()(config, ServerState(), {}, asyncio.get_running_loop())
    transport = RecordingTransport()
    protocol.connection_made(transport)
    protocol.data_received(b"POST /v1/x HTTP/1.1\r\nHost: test\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    await asyncio.sleep(0.02)
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]  # written at once, not held
    protocol.data_received(b"{}")
    for _ in range(100):
        if protocol.cycle.response_complete:
            break
        await asyncio.sleep(0.005)
    protocol.connection_lost(None)
    assert seen_before_the_answer == [[b"HTTP/1.1 100 Continue\r\n\r\n"]]
    assert len(transport.writes) == 2 and transport.writes[1].endswith(b"\r\n\r\n{}")
