"""ASGI wiring: HTTP goes to Django; the ``llmpool-runtime`` channel goes to the runtime consumer."""
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmpool.settings")
django_http = get_asgi_application()

from channels.routing import ChannelNameRouter, ProtocolTypeRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from models_app.consumers import RUNTIME_CHANNEL, RuntimeConsumer  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": ASGIStaticFilesHandler(django_http),
        "channel": ChannelNameRouter({RUNTIME_CHANNEL: RuntimeConsumer.as_asgi()}),
    }
)
