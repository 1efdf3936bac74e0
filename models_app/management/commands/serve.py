"""``manage.py serve``: the embedded default in one process.

daphne serves the Django ASGI app and the runtime worker listens on the
``llmpool-runtime`` channel, both on one event loop with the in-memory
channel layer and SQLite.
"""
import asyncio

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from models_app.conf import startup_service_settings



class Command(BaseCommand):
    help = "Run llm-pool (API, admin and runtime) in one process on the embedded default."

    def add_arguments(self, parser):
        parser.add_argument("--host", help="bind address (default: service.host)")
        parser.add_argument("--port", type=int, help="port (default: service.port)")
        parser.add_argument("--no-migrate", action="store_true", help="do not apply database migrations first")

    def handle(self, *args, **options):
        service = startup_service_settings(self.stderr)
        if not options["no_migrate"]:
            call_command("migrate", interactive=False, verbosity=0)
        host = options["host"] or service.host
        port = options["port"] or service.port

        # daphne installs the asyncio Twisted reactor on import; import it only here.
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server
        from twisted.internet import defer, reactor

        from llmpool.asgi import application
        from models_app.host import runtime_host
        from models_app.host.worker import run_runtime_worker

        def start_runtime():
            asyncio.ensure_future(run_runtime_worker(application))

        def stop_runtime():
            return defer.Deferred.fromFuture(asyncio.ensure_future(runtime_host.shutdown_runtime()))

        reactor.callWhenRunning(start_runtime)
        reactor.addSystemEventTrigger("before", "shutdown", stop_runtime)
        self.stdout.write(f"llm-pool listening on http://{host}:{port}/ (settings: {settings.LLMPOOL_SETTINGS})")
        self.stdout.flush()
        Server(
            application=application,
            endpoints=build_endpoint_description_strings(host=host, port=port),
            signal_handlers=True,
            http_timeout=None,
            verbosity=0,
        ).run()
