"""The service settings the API side needs (read once per process; changes need a restart)."""
import fcntl
import logging
import sys
from contextlib import contextmanager
from functools import lru_cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from runtime.config import ServiceSettings, load_settings
from runtime.errors import InvalidSettings
from runtime.paths import check_state_dir


def require_redis(stderr, alone: str) -> None:
    """For the commands of the production split: exit 2 unless LLMPOOL_REDIS_URL is set
    (``alone``: what runs without the other half, as the message says it)."""
    if not settings.REDIS_URL:
        stderr.write(
            f"runtime_unavailable: {alone} only over Redis; set LLMPOOL_REDIS_URL "
            "(the embedded default runs everything with `manage.py serve`)"
        )
        sys.exit(2)


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


def startup_migrate(stderr) -> None:
    """For the commands that start llm-pool: apply migrations, or exit 2 with
    ``database_unavailable`` when the database cannot be reached (no traceback)."""
    from django.core.management import call_command
    from django.db import OperationalError

    try:
        with _one_migrate_at_a_time():
            call_command("migrate", interactive=False, verbosity=0)
    except OperationalError as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        stderr.write(f"database_unavailable: cannot reach the database {database_label()}: {reason}")
        sys.exit(2)


# A PostgreSQL advisory lock every llm-pool process takes around its start-up migrate ("llmp").
MIGRATE_LOCK_KEY = 0x6C6C6D70


@contextmanager
def _one_migrate_at_a_time():
    """Hold a lock while migrating: the runtime workers of several nodes (and API processes)
    started together on a fresh database would otherwise all create the same tables, and all but
    one fail.  The others wait, then find nothing left to apply.  On PostgreSQL the advisory lock
    ``MIGRATE_LOCK_KEY``; on SQLite (processes of one host sharing its file, as the benchmarks'
    split does) an exclusive lock on ``<database>.migrate-lock`` beside it."""
    from django.db import connection

    if connection.vendor == "sqlite":
        name = str(connection.settings_dict["NAME"])
        if name == ":memory:" or name.startswith("file:"):
            yield
            return
        with open(f"{name}.migrate-lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield  # the lock goes with the file's close
        return
    if connection.vendor != "postgresql":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [MIGRATE_LOCK_KEY])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [MIGRATE_LOCK_KEY])


def database_label() -> str:
    """The default database as a message names it: host, port and name, never the password."""
    database = settings.DATABASES["default"]
    if "sqlite" in database["ENGINE"]:
        return f"{database['NAME']} (SQLite, LLMPOOL_DB_PATH)"
    return f"{database.get('HOST') or 'localhost'}:{database.get('PORT') or 'default port'}/{database['NAME']} " \
           "(LLMPOOL_DATABASE_URL)"


@lru_cache(maxsize=1)
def service_settings() -> ServiceSettings:
    try:
        return load_settings(settings.LLMPOOL_SETTINGS).settings.service
    except InvalidSettings as exc:
        raise ImproperlyConfigured(f"invalid_settings: {exc.message}") from exc
