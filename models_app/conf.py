"""The service settings the API side needs (read once per process; changes need a restart)."""
from functools import lru_cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from runtime.config import ServiceSettings, load_settings
from runtime.errors import InvalidSettings


@lru_cache(maxsize=1)
def service_settings() -> ServiceSettings:
    try:
        return load_settings(settings.LLMPOOL_SETTINGS).settings.service
    except InvalidSettings as exc:
        raise ImproperlyConfigured(f"invalid_settings: {exc.message}") from exc
