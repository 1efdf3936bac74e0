"""``manage.py create_api_key --name N [--models a,b]``: a new inference key, its secret shown once.

The key is stored in the database (as ``POST /v1/admin/keys`` stores it): a running service uses
it within a second, no restart.  ``--settings-entry`` stores nothing and prints the
``service.api_keys`` entry to add to settings.json instead (read at start)."""
import json
import secrets

from django.core.management.base import BaseCommand, CommandError
from pydantic import ValidationError

from models_app import services
from models_app.api.keys import hash_key
from models_app.key_fields import SECRET_PREFIX, row_json
from runtime.config import ApiKey, format_validation_error
from runtime.errors import LLMPoolError


class Command(BaseCommand):
    help = (
        "Make a new inference API key: prints its secret (once: only its sha256 is stored). Stored in the "
        "database (a running service uses it within a second), or with --settings-entry printed as a "
        "service.api_keys entry for settings.json."
    )

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True, help="the key's name, which is also its fairness key")
        parser.add_argument("--models", help="comma-separated models the key may use (default: every model)")
        parser.add_argument("--settings-entry", action="store_true",
                            help="store nothing; print the settings.json entry instead")

    def handle(self, *args, **options):
        models = [name.strip() for name in options["models"].split(",")] if options["models"] else "*"
        if options["settings_entry"]:
            self._settings_entry(options["name"], models)
            return
        try:
            row, secret = services.key_create(fields=services.validated_key_fields(
                {"name": options["name"], "models": models}))
        except LLMPoolError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from None
        self.stdout.write(f"API key (shown only now; store it): {secret}")
        self.stdout.write(json.dumps(row_json(row)))

    def _settings_entry(self, name: str, models) -> None:
        key = SECRET_PREFIX + secrets.token_urlsafe(32)
        entry = {"name": name, "key_sha256": hash_key(key), "models": models}
        try:
            ApiKey.model_validate(entry)  # the line printed is one the settings accept
        except ValidationError as exc:
            problems = format_validation_error(exc)
            raise CommandError("; ".join(f"{p['path'].removeprefix('$.')}: {p['message']}" for p in problems)) from None
        self.stdout.write(f"API key (shown only now; store it): {key}")
        self.stdout.write("Add this entry to service.api_keys in settings.json, then restart llm-pool:")
        self.stdout.write(json.dumps(entry))
