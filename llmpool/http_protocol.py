"""The protocol class uvicorn serves llm-pool's connections with (``llmpool.http_server``):
uvicorn's httptools protocol, with the request head bounded and each response's head sent with
its body."""
from __future__ import annotations

import asyncio

# A request's head (request line and headers) larger than this is a bare 400 and the connection
# closed (httptools has no limit of its own; Twisted's was the same 16 KiB).
MAX_HEAD_BYTES = 16 * 1024


class HeadWithBody:
    """A response's transport (``RequestResponseCycle.transport``) that holds the response's head
    until its body's first write and sends the two in one write.

    uvicorn writes the status line and headers as soon as the app sends ``http.response.start``,
    then the body in a second write: two segments, and two wake-ups of the client for one JSON
    answer, the first of which lets the client take the CPU from the server before the body is
    written (on a small machine, where client and server share the cores).  Go's net/http and
    hyper send a head with a ready body in one write; so does this: the head is held until the
    first body write (an ASGI app sends it right after the start, in the same turn of the loop), or
    written alone at the end of the loop's turn, for a stream whose first event comes later.  Every
    write after the head goes straight through; a close first writes what is held.
    """

    __slots__ = ("_cycle", "_transport", "_loop", "_head", "_flush", "_head_seen")

    def __init__(self, cycle, transport, loop):
        self._cycle, self._transport, self._loop = cycle, transport, loop
        self._head: bytes | None = None
        self._flush: asyncio.Handle | None = None
        self._head_seen = False

    def write(self, data: bytes) -> None:
        if not self._head_seen and self._cycle.response_started:  # the response's head (not a 100 Continue)
            self._head_seen = True
            self._head = data
            self._flush = self._loop.call_soon(self.write_head)
            return
        if self._head is not None:
            data, self._head = self._head + data, None
            self._flush.cancel()
        self._transport.write(data)

    def write_head(self) -> None:
        """The head held, alone (no body came in its turn of the loop); dropped if the connection
        closed meanwhile (uvloop raises on a write to a closed transport)."""
        if self._head is not None:
            head, self._head = self._head, None
            self._flush.cancel()
            if not self._transport.is_closing():
                self._transport.write(head)

    def close(self) -> None:
        self.write_head()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()


def bounded_httptools_protocol():
    """uvicorn's httptools protocol with the request head bounded to ``MAX_HEAD_BYTES``, and each
    response's head sent with its body (``HeadWithBody``)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        _reading_head = True
        _head_bytes = 0  # bytes received while the head is not complete
        _parsed_head = 0  # the request line's URL and the headers parsed so far

        def data_received(self, data: bytes) -> None:
            if self._reading_head:
                self._head_bytes += len(data)
            super().data_received(data)
            # Still in the head after this data: every byte counted is head.
            if self._reading_head and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                self.logger.warning("A request head over %d bytes was refused.", MAX_HEAD_BYTES)
                self.send_400_response("Request header too large.")

        def on_url(self, url: bytes) -> None:
            self._parsed_head += len(url)
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._parsed_head += len(name) + len(value) + 4
            if self._parsed_head > MAX_HEAD_BYTES:
                # Raised in a parser callback: uvicorn answers it as a malformed request (bare 400).
                raise ValueError(f"request head over {MAX_HEAD_BYTES} bytes")
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._reading_head = False
            cycle = self.cycle
            super().on_headers_complete()
            if self.cycle is not cycle:  # a request's cycle (not an upgrade to a WebSocket)
                self.cycle.transport = HeadWithBody(self.cycle, self.transport, self.loop)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._reading_head, self._head_bytes, self._parsed_head = True, 0, 0

    return BoundedHttpToolsProtocol
