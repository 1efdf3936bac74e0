"""The admin WebSocket's origin check: only pages of the service itself may open it.

A browser sends a logged-in operator's session cookie with a WebSocket opened by any page, so
the handshake's ``Origin`` decides, whatever ``ALLOWED_HOSTS`` says (its default ``*`` checks
nothing).  Allowed, as Django's CSRF check allows a form post of the admin pages:

- the request's own origin: ``http://<Host>`` (``https://`` over ``wss``), with a ``Host`` that
  ``ALLOWED_HOSTS`` accepts;
- an origin of ``CSRF_TRUSTED_ORIGINS`` (``LLMPOOL_CSRF_TRUSTED_ORIGINS``, for a reverse proxy
  that changes the host or the scheme), ``https://*.example.com`` patterns included.

A missing ``Origin``, ``Origin: null`` and every other origin are refused before the handshake
completes (the server answers 403).
"""
from __future__ import annotations

import logging
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import is_same_domain, split_domain_port, validate_host

logger = logging.getLogger("llmpool.events")


class SameOriginValidator:
    """ASGI middleware: passes a WebSocket whose origin is the service's own (``origin_allowed``)."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if origin_allowed(scope):
            return await self.application(scope, receive, send)
        logger.info("admin WebSocket refused: origin %r is not this service's (host %r)",
                    header(scope, b"origin"), header(scope, b"host"))
        return await WebsocketDenier()(scope, receive, send)


def origin_allowed(scope) -> bool:
    origin = header(scope, b"origin")
    if origin is None or origin == "null":
        return False
    origin = origin.lower()
    own = own_origin(scope)
    return (own is not None and origin == own) or trusted_origin(origin)


def own_origin(scope) -> str | None:
    """``<scheme>://<host>`` of the request itself, or None without a Host that ALLOWED_HOSTS accepts."""
    host = header(scope, b"host")
    if not host:
        return None
    domain, _ = split_domain_port(host.lower())
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return None
    scheme = "https" if scope.get("scheme") == "wss" else "http"
    return f"{scheme}://{host.lower()}"


def trusted_origin(origin: str) -> bool:
    """Whether CSRF_TRUSTED_ORIGINS lists ``origin``, exactly or by a ``scheme://*.domain`` pattern."""
    try:
        parsed = urlsplit(origin)
    except ValueError:
        return False
    for trusted in settings.CSRF_TRUSTED_ORIGINS:
        trusted = trusted.lower()
        if origin == trusted:
            return True
        pattern = urlsplit(trusted)
        if "*" in pattern.netloc and pattern.scheme == parsed.scheme:
            if is_same_domain(parsed.netloc, pattern.netloc.replace("*", "", 1)):
                return True
    return False


def header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin1")
    return None
