"""The service settings the API side needs (read once per process; changes need a restart)."""
import logging
import sys
from functools import lru_cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from runtime.config import ServiceSettings, load_settings
from runtime.errors import InvalidSettings
from runtime.paths import check_state_dir


def startup_service_settings(stderr) -> ServiceSettings:
    """For the commands that start llm-pool: the service settings, or exit 2 saying what is invalid
    (the settings, or a state folder that cannot be written)."""
    try:
        service = load_settings(settings.LLMPOOL_SETTINGS).settings.service
    except InvalidSettings as exc:
        stderr.write(f"invalid_settings: {exc.message}")
        sys.exit(2)
    try:
        check_state_dir()
    except OSError as exc:
        stderr.write(f"state_dir_unwritable: {exc}")
        sys.exit(2)
    logging.getLogger("llmpool").setLevel(service.log_level.upper())
    return service


@lru_cache(maxsize=1)
def service_settings() -> ServiceSettings:
    try:
        return load_settings(settings.LLMPOOL_SETTINGS).settings.service
    except InvalidSettings as exc:
        raise ImproperlyConfigured(f"invalid_settings: {exc.message}") from exc
