"""Django settings: wiring only.  Service behaviour is configured in settings.json."""
import os
import socket
from pathlib import Path

import dj_database_url

from models_app.transport.messages import RUNTIME_CHANNEL

BASE_DIR = Path(__file__).resolve().parent.parent

# The llm-pool settings file (its local.json lies beside it).
LLMPOOL_SETTINGS = os.environ.get("LLMPOOL_SETTINGS", str(BASE_DIR / "settings.json"))

SECRET_KEY = os.environ.get("LLMPOOL_SECRET_KEY", "llmpool-embedded-insecure-key-set-LLMPOOL_SECRET_KEY")
DEBUG = os.environ.get("LLMPOOL_DEBUG", "") == "1"
ALLOWED_HOSTS = os.environ.get("LLMPOOL_ALLOWED_HOSTS", "*").split(",")
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("LLMPOOL_CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "models_app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# The machine API (/v1/*) needs none of the browser middleware (see llmpool/asgi.py).
API_MIDDLEWARE: list[str] = []

ROOT_URLCONF = "llmpool.urls"
ASGI_APPLICATION = "llmpool.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# LLMPOOL_DATABASE_URL (e.g. postgres://user@127.0.0.1:5432/llmpool) selects the database;
# unset: SQLite at LLMPOOL_DB_PATH (embedded default).
DATABASE_URL = os.environ.get("LLMPOOL_DATABASE_URL")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
    if "postgresql" in DATABASES["default"]["ENGINE"]:
        # libpq waits forever for a host that drops packets; ?connect_timeout= in the URL overrides.
        DATABASES["default"].setdefault("OPTIONS", {}).setdefault("connect_timeout", 10)
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("LLMPOOL_DB_PATH", str(BASE_DIR / "db.sqlite3")),
        }
    }

# LLMPOOL_REDIS_URL selects the production split: API processes and the runtime worker talk over
# Redis.  Unset: the in-memory layer shared by daphne and the runtime in one process.
REDIS_URL = os.environ.get("LLMPOOL_REDIS_URL")
# Identifies this machine's runtime: only one runtime worker may own a node's backends.
LLMPOOL_NODE_ID = os.environ.get("LLMPOOL_NODE_ID") or socket.gethostname()
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "models_app.transport.channel_layer.RedisChannelLayer",
            "CONFIG": {
                # redis-py 8 reads with a 5 s socket timeout, exactly channels-redis's blocking pop
                # time: give reads room or an idle worker dies of a timeout.
                "hosts": [{"address": REDIS_URL, "socket_timeout": 30}],
                "prefix": os.environ.get("LLMPOOL_CHANNEL_PREFIX", "llmpool"),
                # Requests older than this are dropped by Redis; the API has given up on them.
                "expiry": 30,
                # Streams: a reply channel holds at most this many chunks before the runtime waits.
                "capacity": 100,
                # Every node's runtime channel (llmpool-runtime.<node>, a glob) holds as many requests.
                "channel_capacity": {RUNTIME_CHANNEL: 1000, RUNTIME_CHANNEL + ".*": 1000},
            },
        }
    }
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "models_app.transport.channel_layer.InMemoryChannelLayer",
            "CONFIG": {"capacity": 1000, "expiry": 60},
        }
    }

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"

REST_FRAMEWORK = {
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["models_app.api.limits.JSONBodyParser"],
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
    "EXCEPTION_HANDLER": "models_app.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "llm-pool",
    "DESCRIPTION": "A pool of local LLMs: runtime admin API and the OpenAI Responses API.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # The inference endpoints are plain ASGI apps (models_app.api.routes), documented by this hook.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "models_app.api.routes.add_inference_operations",
    ],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "llmpool": {"handlers": ["console"], "level": os.environ.get("LLMPOOL_LOG_LEVEL", "INFO").upper()},
    },
}
