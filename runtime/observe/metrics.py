"""The runtime's Prometheus figures: one prometheus-client registry per ``RuntimeService``.

Counters and histograms move as things happen (a request ends: ``observe_request``; a model
changes state: ``on_transition``, a ``runtime.model.state`` listener); gauges are read from the pool
when scraped (``_PoolCollector``).  ``exposition`` renders the registry in the text format; the
API's ``GET /metrics`` asks for it over the channel layer (the ``metrics`` operation), so every
API process reports the one runtime's figures (docs/observability.md).

Every label value is bounded: model names come from the catalog (a request for an unknown
model counts under ``model=""``), endpoints from ``ENDPOINTS``, codes from runtime.errors,
reasons from runtime.model.state, priority classes from runtime.queue_terms, and fairness
keys are cut to the busiest ``reported_keys`` plus ``other`` (``KeyTally``).  No request text is
ever a label.
"""
from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from runtime.errors import ExecutorQueueFull, FairnessKeyQueueFull, QueueDeadlineExceeded
from runtime.queue_terms import PRIORITY_CLASSES
from runtime.model.state import RuntimeState, TransitionEvent
from runtime.observe.records import RequestRecord

if TYPE_CHECKING:
    from runtime.pool.model_pool import ModelPool

# The inference paths a request can come from (the API sends its path; anything else is "other").
ENDPOINTS = {
    "/v1/responses": "responses",
    "/v1/chat/completions": "chat_completions",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/rerank": "rerank",
    "/rerank": "rerank",
    "/v1/reranking": "rerank",
    "/v1/messages": "messages",
    "/v1/audio/transcriptions": "audio_transcriptions",
    "/v1/audio/translations": "audio_translations",
    "/api/chat": "ollama_chat",
    "/api/generate": "ollama_generate",
    "/api/embed": "ollama_embed",
    "/api/embeddings": "ollama_embeddings",
}
# The codes of a request the queue refused or dropped unstarted: the reasons of llmpool_queue_drops.
QUEUE_DROP_CODES = frozenset({ExecutorQueueFull.code, FairnessKeyQueueFull.code, QueueDeadlineExceeded.code})
OTHER_KEY = "other"  # the fairness keys outside the busiest N
NO_KEY = ""  # a request without a fairness key
ENGINE_STATS_TIMEOUT_SECONDS = 1.0  # an engine process that does not answer in time is left out

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TOKEN_TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
LOAD_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)


def endpoint_label(path: str | None) -> str:
    return ENDPOINTS.get(path or "", "other")


class KeyTally:
    """Served tokens and rejections per fairness key, in bounded memory.

    At most ``capacity`` keys are held; a new key past that evicts the one with the fewest
    tokens, whose figures go to ``other`` for good.  A scrape reports the busiest ``top`` keys
    by tokens and sums the rest into ``other``.
    """

    def __init__(self, capacity: int = 1000):
        self.capacity = capacity
        self.keys: dict[str, list[int]] = {}  # key -> [tokens, rejections]
        self.evicted = [0, 0]

    def add(self, key: str | None, tokens: int = 0, rejections: int = 0) -> None:
        key = NO_KEY if key is None else key
        figures = self.keys.get(key)
        if figures is None:
            if len(self.keys) >= self.capacity:
                smallest = min(self.keys, key=lambda name: self.keys[name][0])
                gone = self.keys.pop(smallest)
                self.evicted[0] += gone[0]
                self.evicted[1] += gone[1]
            figures = self.keys[key] = [0, 0]
        figures[0] += tokens
        figures[1] += rejections

    def report(self, top: int) -> list[tuple[str, int, int]]:
        """``(key, tokens, rejections)`` of the busiest ``top`` keys, then ``other`` if any is left."""
        ranked = sorted(self.keys.items(), key=lambda item: (-item[1][0], -item[1][1], item[0]))
        shown = [(key, tokens, rejected) for key, (tokens, rejected) in ranked[:top] if key != OTHER_KEY]
        named = {key for key, _, _ in shown}
        rest = [figures for key, figures in ranked if key not in named]
        tokens = self.evicted[0] + sum(figures[0] for figures in rest)
        rejected = self.evicted[1] + sum(figures[1] for figures in rest)
        if rest or any(self.evicted):
            shown.append((OTHER_KEY, tokens, rejected))
        return shown


class RuntimeMetrics:
    """The registry and the instruments; ``pool`` answers the pool to read gauges from."""

    def __init__(self, pool: Callable[[], ModelPool]):
        self.pool = pool
        self._served: dict[tuple, Any] = {}  # labelled children of the request instruments (observe_request)
        self.registry = CollectorRegistry()
        r = self.registry
        labels = ["model", "endpoint"]
        self.requests = Counter("llmpool_requests", "Requests that reached the runtime, by status code.",
                                [*labels, "status"], registry=r)
        self.duration = Histogram("llmpool_request_duration_seconds", "Request time in the runtime, admission to the end.",
                                  labels, buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("llmpool_time_to_first_token_seconds", "Admission to the engine's first output.",
                              labels, buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("llmpool_time_per_output_token_seconds",
                              "After the first token, seconds per further output token.",
                              labels, buckets=TOKEN_TIME_BUCKETS, registry=r)
        self.input_tokens = Counter("llmpool_input_tokens", "Prompt tokens of finished requests.", labels, registry=r)
        self.output_tokens = Counter("llmpool_output_tokens", "Output tokens of finished requests.", labels, registry=r)
        self.draft_tokens = Counter("llmpool_spec_decode_draft_tokens", "Speculative decoding: draft tokens the model "
                                    "verified, of finished requests.", ["model"], registry=r)
        self.accepted_tokens = Counter("llmpool_spec_decode_accepted_tokens", "Speculative decoding: draft tokens the "
                                       "model accepted, of finished requests.", ["model"], registry=r)
        self.rejections = Counter("llmpool_rejections", "Requests refused or failed, by error code.",
                                  ["model", "code"], registry=r)
        self.queue_drops = Counter("llmpool_queue_drops", "Requests the model's queue refused (full) or dropped "
                                   "unstarted (past their deadline), by priority class and reason (the code).",
                                   ["model", "priority", "reason"], registry=r)
        self.loads = Counter("llmpool_model_loads", "Loads that ended, by result and reason.",
                             ["model", "result", "reason"], registry=r)
        self.unloads = Counter("llmpool_model_unloads", "Unloads that ended, by result and reason.",
                               ["model", "result", "reason"], registry=r)
        self.load_duration = Histogram("llmpool_model_load_duration_seconds", "From loading to loaded or failed.",
                                       ["model", "result"], buckets=LOAD_BUCKETS, registry=r)
        self.engine_failures = Counter("llmpool_model_engine_failures", "Loaded engines that died.", ["model"],
                                       registry=r)
        self.keys = KeyTally()
        self._loading_since: dict[str, float] = {}
        self._loaded_since: dict[str, float] = {}
        self._scrape: dict[tuple[str, int], dict] = {}  # engine process stats gathered for this scrape
        ProcessCollector(namespace="llmpool_runtime", registry=r)
        r.register(_PoolCollector(self))

    # ---- events ----------------------------------------------------------------------
    def on_transition(self, event: TransitionEvent) -> None:
        if not isinstance(event, TransitionEvent):
            return  # a runtime.model.residency ModelEvent (no state changed)
        model, old, new, reason = event.model, event.old, event.new, event.reason or "none"
        if new is RuntimeState.LOADING:
            self._loading_since[model] = event.at
        elif old is RuntimeState.LOADING:
            result = {RuntimeState.LOADED: "loaded", RuntimeState.FAILED: "failed"}.get(new, "withdrawn")
            self.loads.labels(model, result, reason).inc()
            began = self._loading_since.pop(model, None)
            if began is not None and result != "withdrawn":
                self.load_duration.labels(model, result).observe(max(0.0, event.at - began))
        elif old is RuntimeState.UNLOADING:
            self.unloads.labels(model, "unloaded" if new is RuntimeState.UNLOADED else "failed", reason).inc()
        elif old is RuntimeState.LOADED and new is RuntimeState.FAILED:
            self.engine_failures.labels(model).inc()
        if new is RuntimeState.LOADED:
            self._loaded_since[model] = event.at
        else:
            self._loaded_since.pop(model, None)

    def observe_request(self, record: RequestRecord) -> None:
        """Count one request that ended (answered, refused or failed; a cancelled one is 499)."""
        model, endpoint = record.model or "", record.endpoint
        if record.code is not None:
            self.requests.labels(model, endpoint, str(record.status)).inc()
            self.rejections.labels(model, record.code).inc()
            if record.code in QUEUE_DROP_CODES:
                self.queue_drops.labels(model, record.priority, record.code).inc()
            if record.status == 429:
                self.keys.add(record.fairness_key, rejections=1)
            return
        # A served request: its labelled children, looked up once per (model, endpoint, status)
        # (prometheus-client's labels() costs a few microseconds a call, six calls a request).
        children = self._served.get((model, endpoint, record.status))
        if children is None:
            children = self._served[(model, endpoint, record.status)] = (
                self.requests.labels(model, endpoint, str(record.status)), self.duration.labels(model, endpoint),
                self.input_tokens.labels(model, endpoint), self.output_tokens.labels(model, endpoint),
            )
        requests, duration, input_tokens, output_tokens = children
        requests.inc()
        duration.observe(record.duration)
        input_tokens.inc(record.input_tokens)
        output_tokens.inc(record.output_tokens)
        self.keys.add(record.fairness_key, tokens=record.input_tokens + record.output_tokens)
        if record.draft_tokens is not None:
            self._child(self.draft_tokens, model, None).inc(record.draft_tokens)
            self._child(self.accepted_tokens, model, None).inc(record.accepted_tokens or 0)
        if record.ttft is not None:
            self._child(self.ttft, model, endpoint).observe(record.ttft)
            if record.output_tokens > 1:
                per_token = (record.duration - record.ttft) / (record.output_tokens - 1)
                self._child(self.tpot, model, endpoint).observe(max(0.0, per_token))

    def _child(self, metric, model: str, endpoint: str | None):
        """``metric.labels(model, endpoint)`` (``endpoint`` None: a metric by model alone), made on
        its first observation and kept."""
        key = (id(metric), model, endpoint)
        child = self._served.get(key)
        if child is None:
            child = self._served[key] = metric.labels(model) if endpoint is None else metric.labels(model, endpoint)
        return child

    # ---- scrape ----------------------------------------------------------------------
    async def exposition(self) -> str:
        """The registry in the Prometheus text format, engine processes' stats asked first."""
        self._scrape = await _engine_stats(self.pool())
        try:
            return generate_latest(self.registry).decode()
        finally:
            self._scrape = {}


async def _engine_stats(pool: ModelPool) -> dict[tuple[str, int], dict]:
    """``(model, replica) -> {"rss_bytes", "gpu_memory_bytes"}`` of each engine that has a process:
    an engine process answers its ``stats`` op; a managed server's leader is read from /proc."""
    asks, found = [], {}
    for controller in pool.controllers.values():
        for replica, engine in enumerate(list(controller.engines)):
            process = getattr(engine, "process", None)
            if process is None or process.pid is None:
                continue
            stats = getattr(engine, "stats", None)
            if stats is not None:
                asks.append(((controller.name, replica), stats()))
            else:
                found[(controller.name, replica)] = {"rss_bytes": _rss_of(process.pid), "gpu_memory_bytes": None}
    if asks:
        answers = await asyncio.gather(*(_within(ask, ENGINE_STATS_TIMEOUT_SECONDS) for _, ask in asks),
                                       return_exceptions=True)
        for (where, _), answer in zip(asks, answers):
            if isinstance(answer, dict):
                found[where] = answer
    return found


def _rss_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class _PoolCollector(Collector):
    """The gauges read from the pool at scrape time, and the fairness keys' totals."""

    def __init__(self, metrics: RuntimeMetrics):
        self.metrics = metrics

    def collect(self) -> Iterable:
        pool = self.metrics.pool()
        controllers = list(pool.controllers.values())
        state = GaugeMetricFamily("llmpool_model_state", "1 for the model's current state, 0 for the others.",
                                  labels=["model", "state"])
        gauges = {
            name: GaugeMetricFamily(f"llmpool_model_{name}", text, labels=["model"])
            for name, text in (
                ("queue_depth", "Requests queued in the scheduler."),
                ("inflight", "Requests running on an engine."),
                ("loaded_replicas", "Replicas loaded now."),
                ("waiting_requests", "Requests waiting for the model's load."),
                ("resident_seconds", "Seconds since the model became loaded (0 when not loaded)."),
            )
        }
        queued = GaugeMetricFamily("llmpool_model_queued_requests",
                                   "Requests queued in the scheduler by priority class.", labels=["model", "priority"])
        now = time.time()
        for controller in controllers:
            name = controller.name
            for each in RuntimeState:
                state.add_metric([name, each.value], 1.0 if controller.state is each else 0.0)
            scheduler = controller.scheduler
            gauges["queue_depth"].add_metric([name], scheduler.queue_depth)
            for priority, depth in zip(PRIORITY_CLASSES, scheduler.turns.depth):
                queued.add_metric([name, priority], depth)
            gauges["inflight"].add_metric([name], scheduler.inflight)
            gauges["loaded_replicas"].add_metric([name], len(controller.serving_engines))
            gauges["waiting_requests"].add_metric([name], len(controller.waiters))
            since = self.metrics._loaded_since.get(name)
            gauges["resident_seconds"].add_metric([name], max(0.0, now - since) if since is not None else 0.0)
        yield state
        yield from gauges.values()
        yield queued
        yield from self._processes(controllers)
        yield from self._fairness(pool)
        yield from self._memory(pool)

    @staticmethod
    def _memory(pool) -> Iterable:
        """Each device's budget, what its models hold (measured) and have reserved (loading),
        and each model's charge by kind (runtime.pool.memory)."""
        mib = 1024 * 1024
        budget = GaugeMetricFamily("llmpool_device_budget_bytes", "The memory budget of a device (memory.devices).",
                                   labels=["device"])
        used = GaugeMetricFamily("llmpool_device_charged_bytes",
                                 "Memory the pool charges its models on a device, by kind: measured (loaded) or "
                                 "reserved (the estimate of a load in progress).", labels=["device", "kind"])
        charged = GaugeMetricFamily("llmpool_model_charged_bytes", "What one model is charged on a device.",
                                    labels=["model", "device", "kind"])
        memory = pool.memory
        if memory is not None:
            for device in memory.device_report():
                budget.add_metric([device["device"]], device["budget_mib"] * mib)
                used.add_metric([device["device"], "measured"], device["used_mib"] * mib)
                used.add_metric([device["device"], "reserved"], device["reserved_mib"] * mib)
            for name, charge in list(memory.charges.items()):
                for device, amount in charge.mib.items():
                    charged.add_metric([name, device, charge.kind], amount * mib)
        yield from (budget, used, charged)

    def _processes(self, controllers) -> Iterable:
        rss = GaugeMetricFamily("llmpool_engine_resident_memory_bytes",
                                "Resident memory of each replica's process (engine process or managed server).",
                                labels=["model", "replica", "kind"])
        gpu = GaugeMetricFamily("llmpool_engine_gpu_memory_bytes", "GPU memory an engine process holds (NVML).",
                                labels=["model", "replica"])
        up = GaugeMetricFamily("llmpool_managed_server_up", "1 while a replica's managed server runs, else 0.",
                               labels=["model", "replica"])
        for controller in controllers:
            for replica, engine in enumerate(list(controller.engines)):
                process = getattr(engine, "process", None)
                kind = "engine_process" if hasattr(engine, "stats") else "managed_server"
                labels = [controller.name, str(replica)]
                if kind == "managed_server" and hasattr(engine, "process"):
                    up.add_metric(labels, 1.0 if process is not None and process.running else 0.0)
                stats = self.metrics._scrape.get((controller.name, replica)) or {}
                if stats.get("rss_bytes") is not None:
                    rss.add_metric([*labels, kind], stats["rss_bytes"])
                if stats.get("gpu_memory_bytes") is not None:
                    gpu.add_metric(labels, stats["gpu_memory_bytes"])
        yield from (rss, gpu, up)

    def _fairness(self, pool) -> Iterable:
        top = pool.settings.engine.fairness.reported_keys
        tokens = CounterMetricFamily("llmpool_fairness_served_tokens",
                                     f"Tokens served per fairness key (the busiest {top}, the rest as other).",
                                     labels=["key"])
        rejected = CounterMetricFamily("llmpool_fairness_rejections",
                                       "429 refusals per fairness key (the same keys).", labels=["key"])
        for key, served, refused in self.metrics.keys.report(top):
            tokens.add_metric([key], served)
            rejected.add_metric([key], refused)
        yield tokens
        yield rejected


async def _within(awaitable, seconds: float):
    async with asyncio.timeout(seconds):  # not wait_for, which can drop a cancel on Python 3.11
        return await awaitable
