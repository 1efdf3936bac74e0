"""GET /metrics: the Prometheus text format, rendered by prometheus-client.

The runtime's figures live in the runtime process (runtime.observe.metrics); this view asks for them
over the channel layer (the ``metrics`` operation) at each scrape and hands the parsed families
to a registry of its own (``RuntimeFigures``), next to this API process's own process figures
(``llmpool_api_process_*``) and ``llmpool_runtime_up``.  ``llmpool_key_tokens_total`` is read from
the usage rows (``models_app.quotas.usage``), so every API process answers the pool's totals; its
label sets are bounded, as keys are made by the operator.  Asking the runtime rather than giving
it an HTTP port of its own keeps one way in (the API's port, its tokens) and works the same in
both shapes; every API process answers the same runtime figures.

Open when neither ``service.admin_token`` nor ``service.metrics_token`` is set; else either
token as ``Authorization: Bearer <token>`` (the metrics token opens this path only).
"""
from __future__ import annotations

import hmac

from asgiref.sync import sync_to_async
from django.db import DatabaseError
from django.http import HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from models_app import placement, selectors
from models_app.api.errors import error_json_response
from models_app.conf import service_settings
from models_app.transport.messages import OP_METRICS
from runtime.errors import MethodNotAllowed, RuntimeUnavailable, Unauthorized

_API_PROCESS = ProcessCollector(namespace="llmpool_api", registry=None)


class RuntimeFigures(Collector):
    """The runtime's metric families, parsed from its text (None: the runtime did not answer)."""

    def __init__(self, text: str | None):
        self.text = text

    def collect(self):
        up = GaugeMetricFamily("llmpool_runtime_up", "1 when the runtime answered this scrape, else 0.")
        up.add_metric([], 0.0 if self.text is None else 1.0)
        yield up
        if self.text is not None:
            yield from text_string_to_metric_families(self.text)


class KeyTokens(Collector):
    """The tokens per database key, model and direction (in: prompt, out: completion), from the usage rows."""

    def __init__(self, totals: list[dict]):
        self.totals = totals

    def collect(self):
        family = CounterMetricFamily("llmpool_key_tokens", "Tokens used per inference key, model and direction "
                                     "(the usage rows kept: docs/api.md \"Usage per key\").",
                                     labels=["key", "model", "direction"])
        for total in self.totals:
            family.add_metric([total["name"], total["model"], "in"], total["input"])
            family.add_metric([total["name"], total["model"], "out"], total["output"])
        yield family


def _authorized(request) -> bool:
    service = service_settings()
    tokens = [token for token in (service.admin_token, service.metrics_token) if token is not None]
    if not tokens:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    given = given.strip().encode()
    return scheme.lower() == "bearer" and any(hmac.compare_digest(given, token.encode()) for token in tokens)


async def metrics_view(request) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return error_json_response(MethodNotAllowed(f'Method "{request.method}" not allowed.'), {"Allow": "GET, HEAD"})
    if not _authorized(request):
        return error_json_response(Unauthorized("GET /metrics requires Authorization: Bearer <service.metrics_token or admin_token>"))
    try:
        text = (await placement.call(OP_METRICS))["text"]
    except RuntimeUnavailable:
        text = None
    try:
        totals = await sync_to_async(selectors.key_token_totals)()
    except DatabaseError:
        totals = []
    registry = CollectorRegistry()
    registry.register(_API_PROCESS)
    registry.register(RuntimeFigures(text))
    registry.register(KeyTokens(totals))
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
