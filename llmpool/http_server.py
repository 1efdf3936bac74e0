"""The HTTP server that serves the ASGI application: uvicorn (the default) or daphne.

uvicorn runs on uvloop with httptools' parser and websockets for the admin's live feed: it adds
less to a proxied request than daphne (Twisted) does (docs/performance.md, bench/proxy_overhead.py).
daphne, the server Channels documents, stays selectable (``--server daphne``) for deployments
that want it.  ``manage.py serve`` runs the runtime worker on the same event loop (``on_start``
when the server starts, ``on_stop`` after it stopped); ``manage.py api`` serves the API alone
(the production split).

On SIGTERM or SIGINT, uvicorn stops accepting connections and closes idle ones, lets the
requests in flight finish for up to ``graceful_seconds`` (the runtime still serves them; a
stream still running then is cut), then the process stops the runtime (``on_stop``) and exits 0.
Under daphne the runtime stops at once and requests in flight end with an error.
"""
from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

from models_app import diagnostics
from models_app.host.tasks import cancel_and_wait, cancel_the_rest

SERVERS = ("uvicorn", "daphne")
DEFAULT_SERVER = "uvicorn"
GRACEFUL_SECONDS = 5.0
# A request's head (request line and headers) larger than this is a bare 400 and the connection
# closed (httptools has no limit of its own; Twisted's was the same 16 KiB).
MAX_HEAD_BYTES = 16 * 1024

Hook = Callable[[], Awaitable[None]] | None


def add_arguments(parser) -> None:
    """The options every serving command takes (``manage.py serve``, ``manage.py api``)."""
    parser.add_argument("--host", help="bind address (default: service.host)")
    parser.add_argument("--port", type=int, help="port (default: service.port)")
    parser.add_argument("--server", choices=SERVERS, default=DEFAULT_SERVER,
                        help="the HTTP server (default: uvicorn, on uvloop and httptools)")
    parser.add_argument("--graceful-timeout", type=float, default=GRACEFUL_SECONDS,
                        help="seconds requests in flight get to finish on SIGTERM (uvicorn; default 5)")


def run(application, host: str, port: int, *, server: str = DEFAULT_SERVER, on_start: Hook = None,
        on_stop: Hook = None, graceful_seconds: float = GRACEFUL_SECONDS,
        ready: Callable[[], None] | None = None) -> None:
    """Serve ``application`` on ``host:port`` until SIGTERM/SIGINT (blocks)."""
    if server == "daphne":
        _run_daphne(application, host, port, on_start, on_stop, ready)
    elif server == "uvicorn":
        _run_uvicorn(application, host, port, on_start, on_stop, graceful_seconds, ready)
    else:
        raise ValueError(f"unknown server {server!r}; one of {', '.join(SERVERS)}")


def _run_uvicorn(application, host, port, on_start: Hook, on_stop: Hook, graceful_seconds: float, ready) -> None:
    import uvicorn
    import uvloop

    async def main() -> None:
        config = uvicorn.Config(
            application, host=host, port=port, loop="none", http=bounded_httptools_protocol(), ws="websockets-sansio", lifespan="off",
            access_log=False, log_config=None, log_level="warning", server_header=False,
            timeout_graceful_shutdown=graceful_seconds,
            # The admin's WebSocket carries small JSON frames: compression costs more than it saves.
            ws_per_message_deflate=False,
        )
        http = uvicorn.Server(config)
        started = asyncio.ensure_future(on_start()) if on_start is not None else None
        try:
            serving = asyncio.ensure_future(http.serve())
            while not http.started and not serving.done():
                await asyncio.sleep(0.01)
            if http.started and ready is not None:
                ready()
            await serving
        finally:
            with diagnostics.stacks_if_slow():
                if started is not None:
                    await cancel_and_wait([started])  # a cancel a library drops is sent again
                if on_stop is not None:
                    await on_stop()
                await cancel_the_rest()
        if not http.started:
            raise SystemExit(1)  # uvicorn logged why (the port is taken ...)

    # uvicorn re-raises the signal it caught once it has stopped; these handlers make that a no-op,
    # so the process gets to stop the runtime and exit 0.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: None)
    uvloop.run(main())


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


def _run_daphne(application, host, port, on_start: Hook, on_stop: Hook, ready) -> None:
    # daphne installs the asyncio Twisted reactor on import; import it only here.
    from daphne.endpoints import build_endpoint_description_strings
    from daphne.server import Server
    from twisted.internet import defer, reactor

    def started() -> None:
        if on_start is not None:
            asyncio.ensure_future(on_start())
        if ready is not None:
            ready()

    reactor.callWhenRunning(started)
    if on_stop is not None:
        reactor.addSystemEventTrigger("before", "shutdown", lambda: defer.Deferred.fromFuture(asyncio.ensure_future(on_stop())))
    Server(
        application=application,
        endpoints=build_endpoint_description_strings(host=host, port=port),
        signal_handlers=True,
        http_timeout=None,
        verbosity=0,
    ).run()
