"""``manage.py reload_settings``: ask the running service to reread its settings."""
import json
import sys

import httpx
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand

from models_app.conf import service_settings


class Command(BaseCommand):
    help = "Ask the running llm-pool service to reload settings.json + local.json; prints the result."

    def add_arguments(self, parser):
        parser.add_argument("--url", help="service base URL (default: http://service.host:service.port)")

    def handle(self, *args, **options):
        try:
            service = service_settings()
        except ImproperlyConfigured as exc:
            # The service rejects these files the same way (400 invalid_settings); say why, no traceback.
            self.stderr.write(str(exc))
            sys.exit(1)
        host = "127.0.0.1" if service.host in ("0.0.0.0", "::", "") else service.host
        base = options["url"] or f"http://{host}:{service.port}"
        headers = {"Authorization": f"Bearer {service.admin_token}"} if service.admin_token else {}
        try:
            response = httpx.post(f"{base}/v1/admin/settings/reload", headers=headers, timeout=30)
        except httpx.HTTPError as exc:
            self.stderr.write(f"runtime_unavailable: cannot reach {base}: {exc}")
            sys.exit(3)
        self.stdout.write(json.dumps(response.json(), indent=2))
        if response.status_code != 200:
            sys.exit(1)
