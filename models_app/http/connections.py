"""The protocol class uvicorn serves llm-pool's connections with (``models_app.http.server``):
uvicorn's httptools protocol, with each response's head sent with its body (``HeadWithBody``),
and the connections bounded (``ConnectionLimits``):

- a request's head (request line and headers) is at most ``MAX_HEAD_BYTES``, else a bare 400;
- it must arrive in full within ``service.http_head_timeout_seconds``, counted from the
  connection's start for its first request and from the head's first byte for the next ones,
  else 408 ``request_head_timeout`` and the close (a connection that sent nothing is closed
  unanswered), so a head that trickles in a byte a second holds its connection seconds, not hours;
- between requests a connection idles ``service.http_keep_alive_timeout_seconds`` at most, and
  one whose next request has already arrived is never closed for idling;
- at most ``service.max_connections`` are open (WebSockets included): one more is answered 503
  ``too_many_connections`` as soon as it is accepted, and closed, so the process keeps the file
  descriptors its database, channel layer and engines need.

Each costs a request one timer (armed at the head's first byte, cancelled at its end) and a
connection one count.
"""
from __future__ import annotations

import asyncio
import logging
import resource
import select
from dataclasses import dataclass

from models_app.api.errors import error_answer
from runtime.config import ServiceSettings
from runtime.errors import LLMPoolError, RequestHeadTimeout, TooManyConnections

logger = logging.getLogger("llmpool.http")

# A request's head (request line and headers) larger than this is a bare 400 and the connection
# closed (httptools has no limit of its own; Twisted's is the same 16 KiB).
MAX_HEAD_BYTES = 16 * 1024
# service.max_connections when unset: half the file-descriptor limit (the other half is the
# process's own: database, Redis, engine pipes, logs), and never more than this.
DEFAULT_MAX_CONNECTIONS = 1024
# Refused connections are logged at most this often (with their count), not one line each.
REFUSAL_LOG_SECONDS = 60.0


@dataclass(frozen=True)
class ConnectionLimits:
    """The bounds on uvicorn's connections, from the ``service`` settings."""

    head_timeout: float
    keep_alive_timeout: float
    max_connections: int

    @classmethod
    def from_service(cls, service: ServiceSettings) -> ConnectionLimits:
        return cls(head_timeout=service.http_head_timeout_seconds,
                   keep_alive_timeout=service.http_keep_alive_timeout_seconds,
                   max_connections=service.max_connections or default_max_connections())


def default_max_connections() -> int:
    """Half the process's soft limit on open files, at most ``DEFAULT_MAX_CONNECTIONS``."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(1, min(DEFAULT_MAX_CONNECTIONS, soft // 2))


def closing_answer(exc: LLMPoolError) -> bytes:
    """The whole HTTP answer of ``exc`` (the one error writer's), for a connection about to close."""
    return error_answer(exc, headers={"Connection": "close"}).http_bytes()


def input_pending(transport) -> bool:
    """Whether bytes from the client (or its close) wait unread in the kernel: a request that
    arrived while the loop was busy elsewhere, which its timers must not close the connection on."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


class RefusalLog:
    """A warning for connections refused over the cap, at most every ``REFUSAL_LOG_SECONDS``."""

    def __init__(self, max_connections: int):
        self.max_connections = max_connections
        self.refused = 0
        self.next_warning = 0.0

    def refused_one(self, now: float) -> None:
        self.refused += 1
        if now >= self.next_warning:
            logger.warning("%d connection(s) refused with 503 too_many_connections: %d are open "
                           "(service.max_connections)", self.refused, self.max_connections)
            self.refused, self.next_warning = 0, now + REFUSAL_LOG_SECONDS


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


def bounded_httptools_protocol(limits: ConnectionLimits | None = None):
    """uvicorn's httptools protocol with the bounds of ``limits`` (the ``service`` defaults when
    none) and each response's head sent with its body (``HeadWithBody``)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    limits = limits or ConnectionLimits.from_service(ServiceSettings())
    head_timeout = limits.head_timeout
    head_too_slow = closing_answer(RequestHeadTimeout(
        f"the request head did not arrive within {head_timeout:g} s (service.http_head_timeout_seconds)"))
    too_many = closing_answer(TooManyConnections(
        f"{limits.max_connections} connections are open, the most this service takes "
        "(service.max_connections); try again"))
    refusals = RefusalLog(limits.max_connections)

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        _reading_head = True
        _head_bytes = 0  # bytes received while the head is not complete
        _parsed_head = 0  # the request line's URL and the headers parsed so far
        _head_timer: asyncio.TimerHandle | None = None
        _head_begun = False  # a byte of the next request's head has been parsed

        def connection_made(self, transport) -> None:
            if len(self.connections) >= limits.max_connections:
                self.transport = transport
                transport.write(too_many)
                transport.close()
                refusals.refused_one(self.loop.time())
                return
            super().connection_made(transport)
            self._head_timer = self.loop.call_later(head_timeout, self.head_timed_out)

        def connection_lost(self, exc) -> None:
            self._stop_head_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._reading_head:
                self._head_bytes += len(data)
            super().data_received(data)
            # Still in the head after this data: every byte counted is head.
            if self._reading_head and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                self.logger.warning("A request head over %d bytes was refused.", MAX_HEAD_BYTES)
                self.send_400_response("Request header too large.")

        def on_message_begin(self) -> None:
            self._head_begun = True
            if self._head_timer is None:  # a later request: timed from its first byte
                self._head_timer = self.loop.call_later(head_timeout, self.head_timed_out)
            super().on_message_begin()

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
            self._stop_head_timer()  # before an upgrade hands the transport to the WebSocket
            self._reading_head = self._head_begun = False
            cycle = self.cycle
            super().on_headers_complete()
            if self.cycle is not cycle:  # a request's cycle (not an upgrade to a WebSocket)
                self.cycle.transport = HeadWithBody(self.cycle, self.transport, self.loop)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._reading_head, self._head_bytes, self._parsed_head = True, 0, 0

        def head_timed_out(self) -> None:
            """408 for a head begun and not ended in time; a connection that sent nothing closes
            unanswered, like an idle one."""
            self._head_timer = None
            if self.transport.is_closing():
                return
            if self.flow.read_paused or not (self.cycle is None or self.cycle.response_complete):
                # The server is still answering a request before this one (pipelined): the
                # connection waits on the server, not on the client.
                self._head_timer = self.loop.call_later(head_timeout, self.head_timed_out)
                return
            if self._head_begun:
                self.transport.write(head_too_slow)
            self.transport.close()

        def timeout_keep_alive_handler(self) -> None:
            if not self.transport.is_closing() and input_pending(self.transport):
                # The next request is here: read it, do not close.
                self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                    self.timeout_keep_alive_handler)
                return
            super().timeout_keep_alive_handler()

        def _stop_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

    return BoundedHttpToolsProtocol
