"""``manage.py serve``: the embedded default in one process.

The HTTP server (uvicorn on uvloop by default, daphne with ``--server daphne``;
``models_app.http.server``) serves the Django ASGI app, and the runtime worker listens on the
``llmpool-runtime`` channel, both on one event loop with the in-memory channel layer and SQLite.
"""
from django.conf import settings
from django.core.management.base import BaseCommand

from models_app.conf import startup_migrate, startup_service_settings
from models_app.http import server as http_server


class Command(BaseCommand):
    help = "Run llm-pool (API, admin and runtime) in one process on the embedded default."

    def add_arguments(self, parser):
        http_server.add_arguments(parser)
        parser.add_argument("--no-migrate", action="store_true", help="do not apply database migrations first")

    def handle(self, *args, **options):
        service = startup_service_settings(self.stderr)
        if not options["no_migrate"]:
            startup_migrate(self.stderr)
        from llmpool.asgi import application
        from models_app.host import runtime_host
        from models_app.host.worker import run_runtime_worker

        def announce(url: str) -> None:
            self.stdout.write(f"llm-pool listening on {url} (settings: {settings.LLMPOOL_SETTINGS})")
            self.stdout.flush()

        http_server.serve(application, options, service, announce, on_start=run_runtime_worker,
                          on_stop=runtime_host.shutdown_runtime)
