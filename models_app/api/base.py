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
            self.initial(request, *args, **kwargs)
            handler = getattr(self, request.method.lower(), self.http_method_not_allowed)
            if request.method.lower() not in self.http_method_names:
                handler = self.http_method_not_allowed
            response = handler(request, *args, **kwargs)
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
