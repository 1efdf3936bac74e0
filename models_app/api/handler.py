"""Django for the machine API (/v1/admin/*, /healthz): the same URLs and views, with less per request.

Django's ``ASGIHandler`` hops to a thread several times per request, and the first hop of a
request starts a thread of its own (its ThreadSensitiveContext): for the ``request_started``
signal, to render a DRF response, and to close the response (``request_finished``).  On a fast
admin call those hops are most of the time Django takes.  ``ApiHandler``:

- loads ``settings.API_MIDDLEWARE`` (empty) instead of the browser's session, auth, CSRF and
  messages middleware, each of which would hop to a thread too;
- sends no ``request_started``: its receivers reset the debug query log and close stale database
  connections, and API views never hold a connection of their own (the catalog mirror is written
  by the runtime through ``database_sync_to_async``);
- closes the response inline: ``request_finished`` then runs on the event loop's thread, where it
  finds no connection to close;
- gets rendered responses from the views (``models_app.api.base.APIView``), so no render hop.

Everything else (reading the body, building the request, watching for a disconnect while the
view runs, sending the response) is Django's own code.
"""
from __future__ import annotations

import asyncio

from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.urls import set_script_prefix


class ApiHandler(ASGIHandler):
    def load_middleware(self, is_async=False):
        browser_middleware = settings.MIDDLEWARE
        settings.MIDDLEWARE = settings.API_MIDDLEWARE
        try:
            super().load_middleware(is_async)
        finally:
            settings.MIDDLEWARE = browser_middleware

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            raise ValueError(f"the API handler serves HTTP only, not {scope['type']}")
        await self.handle(scope, receive, send)

    async def handle(self, scope, receive, send):
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        try:
            request, error_response = self.create_request(scope, body_file)
            if request is None:
                await self.send_response(error_response, send)
                error_response.close()
                return
            response = await self._respond_unless_disconnected(request, receive, send)
            if response is not None:
                response.close()
        finally:
            body_file.close()

    async def _respond_unless_disconnected(self, request, receive, send):
        """The view's response once sent, or None when the client went away first (the view is
        cancelled, as Django does: a streaming view's generator closes, its exchange cancels)."""

        async def respond():
            response = await self.run_get_response(request)
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client disconnected while the response was sent
            return response

        listener = asyncio.create_task(self.listen_for_disconnect(receive))
        responder = asyncio.create_task(respond())
        await asyncio.wait([listener, responder], return_when=asyncio.FIRST_COMPLETED)
        if not listener.done():
            listener.cancel()
        elif not responder.done():
            responder.cancel()
        for task in (responder, listener):
            try:
                await task
            except (asyncio.CancelledError, RequestAborted):
                pass
        if responder.cancelled():
            return None
        return responder.result()
