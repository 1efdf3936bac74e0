"""The base of every API view: adrf's async APIView, minus the thread hops of a request."""
from __future__ import annotations

import inspect

from adrf.views import APIView as AdrfAPIView
from django.http import HttpResponse
from rest_framework.response import Response


class APIView(AdrfAPIView):
    """adrf runs ``initial`` (content negotiation, authentication, permission and throttle
    checks) through ``sync_to_async``.  Ours do no I/O (the admin token check is a constant-time
    compare), so they run inline on the event loop.  A DRF ``Response`` is rendered here too
    (JSON, no I/O) and handed on as a plain ``HttpResponse``: Django renders a response that
    still has a ``render`` method in a thread."""

    async def async_dispatch(self, request, *args, **kwargs):
        self.args = args
        self.kwargs = kwargs
        request = self.initialize_request(request, *args, **kwargs)
        self.request = request
        self.headers = self.default_response_headers
        try:
            method = request.method.lower()
            if method not in self.http_method_names or not hasattr(self, method):
                # A method the view does not declare is 405 whoever asks, before any credential is
                # checked: its answer says nothing about the view that a 401 would hide.
                self.http_method_not_allowed(request, *args, **kwargs)
            self.initial(request, *args, **kwargs)
            response = getattr(self, method)(request, *args, **kwargs)
            if inspect.isawaitable(response):  # DRF's own options() is sync
                response = await response
        except Exception as exc:
            response = self.handle_exception(exc)
        self.response = self.finalize_response(request, response, *args, **kwargs)
        if isinstance(self.response, Response):
            self.response = rendered(self.response)
        return self.response


def rendered(response: Response) -> HttpResponse:
    """The DRF response rendered, as a plain HttpResponse with the same status and headers."""
    response.render()
    plain = HttpResponse(response.content, status=response.status_code)
    for name, value in response.items():
        plain[name] = value
    return plain
