"""ASGI wiring: HTTP goes to Django, the admin WebSocket to its consumer; the ``llmpool-runtime``
channel (embedded) and this node's ``llmpool-runtime.<node>`` (split) go to the runtime consumer.

POST /v1/responses, /v1/chat/completions, /v1/completions and /v1/embeddings, the hot paths, are
served by plain ASGI apps (the route table ``models_app.api.routes.INFERENCE_ROUTES``): Django's request handling costs several thread hops
per request, which dominated the latency of a request to a fast model.  The rest of the machine
API (/v1, /v1/*, /healthz) runs through ``models_app.api.handler.ApiHandler``: Django without the browser's
middleware and without most of those thread hops.  CORS for browser apps
(``models_app.api.cors``, off unless service.cors_allowed_origins is set) wraps all of HTTP.
"""
import os

from django.core.asgi import get_asgi_application

from models_app import diagnostics

diagnostics.install()
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmpool.settings")
django_http = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from models_app.api.client_timeouts import with_client_timeouts  # noqa: E402
from models_app.api.cors import with_cors  # noqa: E402
from models_app.api.handler import ApiHandler  # noqa: E402
from models_app.api.routes import INFERENCE_ROUTES  # noqa: E402
from models_app.workbench.origin import SameOriginValidator  # noqa: E402
from models_app.workbench.urls import websocket_urlpatterns  # noqa: E402


api_http = ApiHandler()


async def http_router(scope, receive, send):
    path = scope["path"]
    inference = INFERENCE_ROUTES.get(path)
    if inference is not None:
        await inference(scope, receive, send)
        return
    machine_api = path.startswith("/v1/") and path != "/v1/openapi.json" or path in ("/v1", "/healthz", "/metrics")
    await (api_http if machine_api else browser_http)(scope, receive, send)


browser_http = ASGIStaticFilesHandler(django_http)

application = ProtocolTypeRouter(
    {
        # CORS (service.cors_allowed_origins) in front of every HTTP path, inference apps included.
        # The body read timeout (service.request_body_timeout_seconds) bounds every HTTP request.
        "http": with_cors(with_client_timeouts(http_router)),
        # The admin pages' live feed: session login (staff only) and same-origin browsers only,
        # whatever ALLOWED_HOSTS allows.
        "websocket": SameOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
