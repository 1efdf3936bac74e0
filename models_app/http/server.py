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
from models_app.http.connections import ConnectionLimits, bounded_httptools_protocol
from runtime.config import ServiceSettings

SERVERS = ("uvicorn", "daphne")
DEFAULT_SERVER = "uvicorn"
GRACEFUL_SECONDS = 5.0

Hook = Callable[[], Awaitable[None]] | None


def add_arguments(parser) -> None:
    """The options every serving command takes (``manage.py serve``, ``manage.py api``)."""
    parser.add_argument("--host", help="bind address (default: service.host)")
    parser.add_argument("--port", type=int, help="port (default: service.port)")
    parser.add_argument("--server", choices=SERVERS, default=DEFAULT_SERVER,
                        help="the HTTP server (default: uvicorn, on uvloop and httptools)")
    parser.add_argument("--graceful-timeout", type=float, default=GRACEFUL_SECONDS,
                        help="seconds requests in flight get to finish on SIGTERM (uvicorn; default 5)")


def serve(application, options: dict, service: ServiceSettings, announce: Callable[[str], None], *,
          on_start: Hook = None, on_stop: Hook = None) -> None:
    """Serve ``application`` as a serving command's ``options`` say (``add_arguments``): on
    ``--host``/``--port``, else ``service.host``/``service.port``, with ``service``'s connection
    bounds; ``announce(url)`` once the server listens (blocks, as ``run``)."""
    host = options["host"] or service.host
    port = options["port"] or service.port

    async def started() -> None:
        from models_app.api.keys import warm_key_ring  # the API's keys, once Django is set up
        from models_app.quotas import usage

        warming = asyncio.ensure_future(warm_key_ring())  # beside on_start (the runtime worker runs on)
        usage.start_periodic()  # ended with the rest of the tasks at the stop
        if on_start is not None:
            await on_start()
        await warming

    async def stopped() -> None:
        from models_app.quotas import usage

        await usage.flush()  # the requests in flight are answered by now: their usage is written
        if on_stop is not None:
            await on_stop()

    run(application, host, port, limits=ConnectionLimits.from_service(service), server=options["server"],
        on_start=started, on_stop=stopped, graceful_seconds=options["graceful_timeout"],
        ready=lambda: announce(f"http://{host}:{port}/"))


def run(application, host: str, port: int, *, limits: ConnectionLimits, server: str = DEFAULT_SERVER,
        on_start: Hook = None, on_stop: Hook = None, graceful_seconds: float = GRACEFUL_SECONDS,
        ready: Callable[[], None] | None = None) -> None:
    """Serve ``application`` on ``host:port`` until SIGTERM/SIGINT (blocks).  ``limits`` bound
    uvicorn's connections; daphne has bounds of its own (docs/deployment.md)."""
    if server == "daphne":
        _run_daphne(application, host, port, on_start, on_stop, ready)
    elif server == "uvicorn":
        _run_uvicorn(application, host, port, limits, on_start, on_stop, graceful_seconds, ready)
    else:
        raise ValueError(f"unknown server {server!r}; one of {', '.join(SERVERS)}")


def _run_uvicorn(application, host, port, limits: ConnectionLimits, on_start: Hook, on_stop: Hook,
                 graceful_seconds: float, ready) -> None:
    import uvicorn
    import uvloop

    async def main() -> None:
        config = uvicorn.Config(
            application, host=host, port=port, loop="none", http=bounded_httptools_protocol(limits),
            ws="websockets-sansio", lifespan="off", access_log=False, log_config=None, log_level="warning",
            server_header=False, timeout_graceful_shutdown=graceful_seconds,
            timeout_keep_alive=limits.keep_alive_timeout,
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
