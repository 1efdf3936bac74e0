"""CORS for browser apps: ``service.cors_allowed_origins`` names the origins whose pages may call
the API; empty (the default) leaves CORS off and every response as it was.

It wraps the whole HTTP router (``llmpool.asgi``), so it covers every /v1 path, the plain ASGI
inference apps and the Django-served ones alike, except the admin API (/v1/admin/*): a page
of another origin may run inference and list models, never load, unload or reload.  The work is
starlette's ``CORSMiddleware``:

- a preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) is answered by
  the middleware alone, 200 when the origin is listed, the method GET or POST and Chrome's
  private network request (a public page calling a private address) expected, else 400
  ``Disallowed CORS origin`` in plain text;
- any other request with a listed ``Origin`` gets ``Access-Control-Allow-Origin: <origin>``
  (``*`` when the list holds ``"*"``) and ``Vary: Origin``; an unlisted origin gets neither,
  which the browser takes as a refusal.

Every request header is allowed (``Authorization``, ``Content-Type``, the fairness headers, the
openai JavaScript SDK's ``X-Stainless-*``): the origin list is the boundary, and no cookie is
ever honoured (credentials stay off).  ``Retry-After`` and ``WWW-Authenticate`` are exposed to
the page's script.  The API process reads the origins once, with the rest of its service
settings (``models_app.conf.service_settings``, as ``service.api_keys``): a change needs a restart.
"""
from __future__ import annotations

from starlette.middleware.cors import CORSMiddleware

from models_app.conf import service_settings
from runtime.config import ServiceSettings

ALLOWED_METHODS = ("GET", "POST")
EXPOSED_HEADERS = ("Retry-After", "WWW-Authenticate")


def is_cors_path(path: str) -> bool:
    """Whether CORS applies to ``path``: everything under /v1 except the admin API."""
    if path != "/v1" and not path.startswith("/v1/"):
        return False
    return path != "/v1/admin" and not path.startswith("/v1/admin/")


def with_cors(app):
    """``app`` behind CORS as the API process's service settings say (nothing added when off)."""
    built: list[tuple[ServiceSettings, CORSMiddleware | None]] = []

    def browser_app() -> CORSMiddleware | None:
        service = service_settings()
        if not built or built[0][0] is not service:
            origins = service.cors_allowed_origins
            middleware = CORSMiddleware(
                app,
                allow_origins=origins,
                allow_methods=ALLOWED_METHODS,
                allow_headers=["*"],
                allow_private_network=True,
                expose_headers=EXPOSED_HEADERS,
            ) if origins else None
            built[:] = [(service, middleware)]
        return built[0][1]

    async def cors_app(scope, receive, send):
        middleware = browser_app() if scope["type"] == "http" and is_cors_path(scope["path"]) else None
        await (middleware or app)(scope, receive, send)

    return cors_app
