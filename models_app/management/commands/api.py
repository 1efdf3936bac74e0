"""``manage.py api``: an API process of the production split (HTTP API, admin pages, the admin
WebSocket), talking to the runtime workers over Redis.

The same server as ``serve`` (uvicorn on uvloop by default, ``--server daphne``); run one or
more beside the runtime workers (``manage.py runtime``).  ``daphne llmpool.asgi:application`` and
``uvicorn llmpool.asgi:application`` serve the same application, without these defaults.
"""
from django.core.management.base import BaseCommand

from models_app.conf import require_redis, startup_service_settings
from models_app.http import server as http_server


class Command(BaseCommand):
    help = "Run an llm-pool API process (production split; the runtime runs in `manage.py runtime`)."

    def add_arguments(self, parser):
        http_server.add_arguments(parser)

    def handle(self, *args, **options):
        require_redis(self.stderr, "an API process alone reaches the runtime")
        service = startup_service_settings(self.stderr)
        from llmpool.asgi import application

        def announce(url: str) -> None:
            self.stdout.write(f"llm-pool API listening on {url}")
            self.stdout.flush()

        http_server.serve(application, options, service, announce)
