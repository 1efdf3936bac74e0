"""The base of every API view: adrf's async APIView, minus one thread hop per request."""
from __future__ import annotations

from adrf.views import APIView as AdrfAPIView


class APIView(AdrfAPIView):
    """adrf runs ``initial`` (content negotiation, authentication, permission and throttle
    checks) through ``sync_to_async``.  Ours do no I/O (the admin token check is a constant-time
    compare), so they run inline on the event loop."""

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
            response = await handler(request, *args, **kwargs)
        except Exception as exc:
            response = self.handle_exception(exc)
        self.response = self.finalize_response(request, response, *args, **kwargs)
        return self.response
