"""``manage.py create_api_key NAME [--models a,b]``: a new inference key, shown once."""
import json
import secrets

from django.core.management.base import BaseCommand, CommandError
from pydantic import ValidationError

from models_app.api.keys import hash_key
from runtime.config import ApiKey, format_validation_error


class Command(BaseCommand):
    help = (
        "Make a new inference API key: prints the key (once: only its sha256 is stored) and the "
        "service.api_keys entry to add to settings.json; the service reads its keys at start."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", help="the key's name, which is also its fairness key")
        parser.add_argument("--models", help="comma-separated models the key may use (default: every model)")

    def handle(self, *args, **options):
        key = secrets.token_urlsafe(32)
        models = [name.strip() for name in options["models"].split(",")] if options["models"] else "*"
        entry = {"name": options["name"], "key_sha256": hash_key(key), "models": models}
        try:
            ApiKey.model_validate(entry)  # the line printed is one the settings accept
        except ValidationError as exc:
            problems = format_validation_error(exc)
            raise CommandError("; ".join(f"{p['path'].removeprefix('$.')}: {p['message']}" for p in problems)) from None
        self.stdout.write(f"API key (shown only now; store it): {key}")
        self.stdout.write("Add this entry to service.api_keys in settings.json, then restart llm-pool:")
        self.stdout.write(json.dumps(entry))
