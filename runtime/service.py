"""The runtime's operations, as the Channels consumer calls them.

``RuntimeService.handle(op, payload, emit)`` is the one entry point: admin
reads and writes, settings reload, and generation (whose text deltas go out
through ``emit`` while the request runs).  Everything here is plain asyncio.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable


from runtime.observe.activity import RequestObserver, activity_answer
from runtime.observe.records import RequestRecord
from runtime.inference.admission import engine_request, estimate_prompt_tokens
from runtime.inference.prefix_marks import prefix_marks
from runtime.inference.pipeline import Emit, Output, run_on_engine
from runtime.config import parse_load_body
from runtime.inference.embedding import EmbeddingRequest, check_embedding_request, embed_on_engine, estimate_input_tokens
from runtime.model.queueing import before_deadline, queue_ticket
from runtime.model.tickets import Ticket
from runtime.inference.rerank import check_rerank_request, rerank_on_engine
from runtime.inputs.rerank import RerankRequest, estimate_rerank_tokens
from runtime.errors import BackendError, SettingsReloadAborted, UnknownOperation
from runtime.gpu import probe_gpus
from runtime.observe.metrics import RuntimeMetrics
from runtime.observe.model_logs import model_logs
from runtime.paths import state_dir
from runtime.pool.model_pool import ModelPool
from runtime.observe.read_models import gpu_model_entry, model_entry
from runtime.inputs.request import (
    GENERATE_ADMITTED,
    GENERATE_CANCELLED,
    GENERATE_WAITING,
    ForwardedRequest,
    typed_request,
)
from runtime.model.state import RuntimeState, TransitionEvent
from runtime.inference.token_count import count_tokens
from runtime.inference.transcription import run_transcription
from runtime.supervisor import sweep_stale_processes

logger = logging.getLogger("llmpool.runtime")

# A reload prepared for several nodes (op_reload_prepare) waits this long at most for its commit
# or abort, holding its models' loads meanwhile; then it aborts by itself.
RELOAD_HOLD_SECONDS = 30.0

ReloadListener = Callable[["RuntimeService"], Awaitable[None]]


class RuntimeService:
    def __init__(
        self,
        settings_path: str,
        listeners: list[Callable[[TransitionEvent], None]] | None = None,
        reload_listeners: list[ReloadListener] | None = None,
        node: str | None = None,
    ):
        """``listeners`` get every lifecycle transition of every model (see ``runtime.model.state``).

        ``reload_listeners`` run (awaited, in order) after each settings reload that succeeded,
        before its diff is answered, so the caller of a reload sees their effects; a listener
        that raises fails the reload's answer (the reload itself stays applied).
        """
        self.node = node  # the node name this runtime serves (None: every model of the file)
        self.pool = ModelPool(settings_path, listeners, node=node)
        self._prepared: dict[str, tuple[asyncio.Future, asyncio.Task]] = {}  # reload_id -> decision, reload
        self.metrics = RuntimeMetrics(lambda: self.pool)  # runtime.observe.metrics: GET /metrics's figures
        self.pool.listeners.append(self.metrics.on_transition)
        self.observer = RequestObserver(self.metrics)  # runtime.observe.activity: each request's record
        self.reload_listeners = list(reload_listeners or [])
        self._requests: dict[str, asyncio.Task] = {}
        self._ops: dict[str, Callable[[dict, Emit], Awaitable[dict]]] = {
            "list_models": self.op_list_models, "get_model": self.op_get_model, "load": self.op_load,
            "unload": self.op_unload, "reconfigure": self.op_reconfigure, "sleep": self.op_sleep,
            "wake": self.op_wake, "reload_settings": self.op_reload_settings,
            "reload_prepare": self.op_reload_prepare, "reload_commit": self.op_reload_commit,
            "reload_abort": self.op_reload_abort, "gpu_memory": self.op_gpu_memory, "catalog": self.op_catalog,
            "metrics": self.op_metrics, "activity": self.op_activity, "model_logs": self.op_model_logs,
            "generate": self.op_generate, "embed": self.op_embed, "transcribe": self.op_transcribe,
            "rerank": self.op_rerank,
            "count_tokens": lambda payload, emit: count_tokens(self.pool, payload),
        }

    async def start(self, *, load_enabled: bool = True) -> None:
        # Managed servers a crashed runtime left behind die before anything loads.
        killed = await asyncio.to_thread(sweep_stale_processes, state_dir())
        if killed:
            logger.warning("killed %d managed server(s) left by a previous runtime", len(killed))
        await self.pool.start(load_enabled=load_enabled)
        self.observer.configure(self.pool.startup_service)

    async def shutdown(self) -> None:
        for task in list(self._requests.values()):
            task.cancel()
        await self.pool.shutdown()

    async def handle(self, op: str, payload: dict, emit: Emit) -> dict:
        handler = self._ops.get(op)
        if handler is None:
            raise UnknownOperation(f"unknown runtime operation {op!r}")
        return await handler(payload, emit)

    # ---- admin -----------------------------------------------------------------------
    async def op_list_models(self, payload, emit) -> dict:
        return {"models": [self.entry(c) for c in self.pool.controllers.values()]}

    async def op_get_model(self, payload, emit) -> dict:
        return self.entry(self.pool.controller(payload["name"]))

    async def op_load(self, payload, emit) -> dict:
        body = parse_load_body(payload.get("body"))  # the only check of the schema: 422 before 404
        controller = self.pool.controller(payload["name"])
        replicas = body.pop("replicas", None)
        if payload.get("dry_run"):  # ?dry_run=true: the memory plan, nothing acted on (docs/api.md)
            return await controller.plan(body, replicas)
        await controller.load(body, replicas)
        return self.entry(controller)

    async def op_unload(self, payload, emit) -> dict:
        controller = self.pool.controller(payload["name"])
        produced = await controller.unload()
        # The entry as now, but in the state the unload produced: a load that another call
        # started since is that call's answer.
        return {**self.entry(controller), "runtime_state": produced.value, "is_loaded": produced is RuntimeState.LOADED}

    async def op_reconfigure(self, payload, emit) -> dict:
        """POST .../reconfigure (runtime.model.residency): the body checked as a load body (422), then
        the reconfigurable fields changed with the model loaded; the entry and what changed."""
        body = parse_load_body(payload.get("body"))  # replicas, if named, is not reconfigurable (400)
        controller = self.pool.controller(payload["name"])
        done = await controller.reconfigure(body)
        return {**self.entry(controller), "reconfigured": done}

    async def op_sleep(self, payload, emit) -> dict:
        controller = self.pool.controller(payload["name"])
        slept = await controller.sleep()
        return {**self.entry(controller), "slept": slept}

    async def op_wake(self, payload, emit) -> dict:
        controller = self.pool.controller(payload["name"])
        woke = await controller.wake()
        return {**self.entry(controller), "woke": woke}

    async def op_reload_settings(self, payload, emit) -> dict:
        diff = await self.pool.reload()
        for listener in self.reload_listeners:
            await listener(self)
        return diff

    # A reload over several nodes, two-phase (models_app.placement.several): every node checks and
    # holds (prepare), then every node swaps (commit), or every prepared node lets go (abort).
    async def op_reload_prepare(self, payload, emit) -> dict:
        """Check the files as a reload would, hold every model's loads and answer the diff; the
        reload waits for op_reload_commit / op_reload_abort (at most ``hold_seconds``)."""
        reload_id = str(payload["reload_id"])
        loop = asyncio.get_running_loop()
        checked, decision = loop.create_future(), loop.create_future()
        hold = float(payload.get("hold_seconds") or RELOAD_HOLD_SECONDS)

        async def decide(diff: dict) -> bool:
            checked.set_result(diff)
            try:
                async with asyncio.timeout(hold):
                    return await asyncio.shield(decision)
            except TimeoutError:
                logger.warning("prepared reload %s: no commit within %g s; aborted", reload_id, hold)
                return False

        task = asyncio.create_task(self.pool.reload(decide), name=f"reload:{reload_id}")
        self._prepared[reload_id] = (decision, task)
        task.add_done_callback(lambda _t: self._prepared.pop(reload_id, None))
        await asyncio.wait((checked, task), return_when=asyncio.FIRST_COMPLETED)
        if checked.done():
            return {**checked.result(), "reload_id": reload_id}
        return task.result()  # the refusal (InvalidSettings, SettingsReloadConflict) raises here

    async def op_reload_commit(self, payload, emit) -> dict:
        """Swap to the prepared reload's catalog; answers its diff."""
        decision, task = self._prepared_reload(payload)
        if not decision.done():
            decision.set_result(True)
        diff = await asyncio.shield(task)
        for listener in self.reload_listeners:
            await listener(self)
        return diff

    async def op_reload_abort(self, payload, emit) -> dict:
        """Let go of a prepared reload: nothing changes (an unknown or finished one is fine)."""
        prepared = self._prepared.get(str(payload.get("reload_id")))
        if prepared is not None:
            decision, task = prepared
            if not decision.done():
                decision.set_result(False)
            await asyncio.gather(task, return_exceptions=True)
        return {"aborted": True}

    def _prepared_reload(self, payload) -> tuple[asyncio.Future, asyncio.Task]:
        prepared = self._prepared.get(str(payload.get("reload_id")))
        if prepared is None:
            raise SettingsReloadAborted("no such prepared reload (it was aborted, or its hold ran out); nothing changed")
        return prepared

    async def op_gpu_memory(self, payload, emit) -> dict:
        gpus, error = await asyncio.to_thread(probe_gpus)
        models = [gpu_model_entry(c) for c in self.pool.controllers.values()]
        devices = self.pool.memory.device_report() if self.pool.memory is not None else []
        return {"gpus": gpus, "models": models, "error": error, "devices": devices}

    async def op_catalog(self, payload, emit) -> dict:
        """What the Django catalog mirror stores."""
        return {
            "models": [
                {
                    "name": c.entry.name,
                    "backend": c.entry.definition.backend,
                    "enabled": c.entry.definition.enabled,
                    "definition": c.entry.definition_dict(),
                    "sources": list(c.entry.sources),
                }
                for c in self.pool.controllers.values()
            ],
            "service": self.pool.settings.service.model_dump(),
            # Every model of the settings file, other nodes' too (the mirror keeps their rows).
            "configured_models": sorted(self.pool.current.model_nodes or self.pool.controllers),
        }

    def entry(self, controller) -> dict:
        """The admin entry with its rolling ``stats`` (runtime.observe.activity)."""
        return {**model_entry(controller), "stats": self.observer.ring.stats(controller.name)}

    # ---- observability (runtime.observe.metrics, runtime.observe.activity) ---------------------------
    async def op_metrics(self, payload, emit) -> dict:
        return {"text": await self.metrics.exposition()}

    async def op_activity(self, payload, emit) -> dict:
        """GET /v1/admin/activity: the ring's requests, newest first (``model``, ``limit`` optional)."""
        return activity_answer(self.pool, self.observer, payload)

    async def op_model_logs(self, payload, emit) -> dict:
        """GET /v1/admin/models/{name}/logs: each loaded replica's process output (runtime.observe.model_logs)."""
        return model_logs(self.pool, payload)

    # ---- generation ------------------------------------------------------------------
    async def op_generate(self, payload, emit) -> dict:
        task = asyncio.current_task()
        request_id = payload["request_id"]
        self._requests[request_id] = task
        try:
            return await self.observer.run(payload, lambda record: self._generate(payload, emit, record))
        finally:
            self._requests.pop(request_id, None)

    async def _generate(self, payload: dict, emit: Emit, record: RequestRecord) -> dict:
        # a name, an alias, or a LoRA adapter's id: the base's controller and the adapter it applies
        controller, adapter = self.pool.lookup_target(payload["model"])
        payload = {**payload, "adapter": adapter}
        record.model = controller.name
        runs = engine_request(controller.entry, payload, self.pool.settings.engine.decoding,
                              self.pool.startup_service["allow_remote_execution"])
        request = typed_request(runs)
        if request.keep_alive_seconds is not None:  # the edge passes one only where the operator allows it
            controller.set_keep_alive(request.keep_alive_seconds)
        ticket = queue_ticket(request, controller.entry.definition, estimate_prompt_tokens(request), record.started,
                              prefix=prefix_marks(request))
        # A forwarded stream opens once its upstream has answered, so the upstream's refusal is a 400.
        forwarded = isinstance(runs, ForwardedRequest)
        output = Output(request, emit, open_on_first_chunk=request.stream and forwarded, record=record)

        async def waiting() -> None:  # the model loads for this request: a stream may open now
            if request.stream:
                await emit({"event": GENERATE_WAITING, "model": controller.name})

        try:
            dispatched = await before_deadline(ticket, controller.admit(ticket, record.waited_for_load(waiting)))
            record.admitted()
            try:
                if request.stream and not forwarded:  # the API answers a stream's headers only now: errors before
                    await emit({"event": GENERATE_ADMITTED})  # this get their status
                lease = await before_deadline(ticket, dispatched)
                record.leased(lease.replica)
                lease.check()
                await run_on_engine(controller, lease, runs, output)
                await output.open_stream()  # a forwarded stream the upstream ended without a chunk
            finally:
                controller.finish(ticket, output.tokens_used(ticket))
        except asyncio.CancelledError:
            used = output.usage_so_far(ticket, started=record.dispatched is not None)
            record.input_tokens, record.output_tokens = used["input_tokens"], used["output_tokens"]
            # The edge waits for this to charge the caller's key what the request used.
            await _quietly(emit({"event": GENERATE_CANCELLED, "usage": used}))
            raise
        if output.finished is None:
            raise BackendError(f"the {controller.entry.definition.backend} engine ended without a result")
        return {**output.result(), "timings": record.timings()}  # the phases Ollama's answers report

    # ---- embeddings and rerank -------------------------------------------------------------
    async def op_embed(self, payload, emit) -> dict:
        """One POST /v1/embeddings request: ``{"vectors": [[float]], "usage": {"prompt_tokens"}}``.

        The same path as generate (runtime.inference.embedding): lookup, checks, admission, the
        scheduler's fair share, a replica's lease, the request timeout; cancellable the same way.
        """
        return await self._observed(payload, lambda record: self._embed(payload, record))

    async def op_rerank(self, payload, emit) -> dict:
        """One POST /v1/rerank request: ``{"scores": [float], "usage": {"prompt_tokens"}}``, a
        score per document in the request's order; the path of an embedding (runtime.inference.rerank)."""
        return await self._observed(payload, lambda record: self._rerank(payload, record))

    async def _observed(self, payload: dict, work: Callable[[RequestRecord], Awaitable[dict]]) -> dict:
        """``work`` as one observed request, cancellable by its request id."""
        request_id = payload["request_id"]
        self._requests[request_id] = asyncio.current_task()
        try:
            return await self.observer.run(payload, work)
        finally:
            self._requests.pop(request_id, None)

    async def _embed(self, payload: dict, record: RequestRecord) -> dict:
        controller = self.pool.lookup(payload["model"])  # a name or an alias
        record.model = controller.name
        request = EmbeddingRequest.from_wire(payload)
        check_embedding_request(controller.entry, request, self.pool.startup_service["allow_remote_execution"])
        ticket = queue_ticket(request, controller.entry.definition, estimate_input_tokens(request), record.started)
        vectors, used = await self._on_lease(controller, ticket, lambda lease: embed_on_engine(controller, lease, request))
        return {"vectors": vectors, "usage": {"prompt_tokens": used}}

    async def _rerank(self, payload: dict, record: RequestRecord) -> dict:
        controller = self.pool.lookup(payload["model"])
        record.model = controller.name
        request = RerankRequest.from_wire(payload)
        check_rerank_request(controller.entry, self.pool.startup_service["allow_remote_execution"])
        estimate = estimate_rerank_tokens(request.query, request.documents)
        ticket = queue_ticket(request, controller.entry.definition, estimate, record.started)
        scores, used = await self._on_lease(controller, ticket, lambda lease: rerank_on_engine(controller, lease, request))
        return {"scores": scores, "usage": {"prompt_tokens": used}}

    @staticmethod
    async def _on_lease(controller, ticket: Ticket, run) -> tuple[list, int]:
        """``run(lease)`` on the replica ``ticket`` is admitted to, once it is dispatched before its
        queue deadline: ``(answer, tokens used)``, the scheduler charged those tokens (the estimate
        when the engine did not answer)."""
        dispatched = await before_deadline(ticket, controller.admit(ticket))
        used = None
        try:
            lease = await before_deadline(ticket, dispatched)
            lease.check()
            answer, used = await run(lease)
            lease.check()
        finally:
            controller.finish(ticket, used)
        return answer, used

    # ---- speech to text --------------------------------------------------------------
    async def op_transcribe(self, payload, emit) -> dict:
        """One POST /v1/audio/transcriptions (or translations) request (runtime.inference.transcription):
        the same lookup, admission, scheduler, lease and timeout as generate; cancellable the same way."""
        allow_remote = self.pool.startup_service["allow_remote_execution"]
        return await self._observed(
            payload, lambda record: run_transcription(self.pool, payload, emit, record, allow_remote)
        )


async def _quietly(sending: Awaitable[None]) -> None:
    """A last word to a caller that went away: its channel may be gone too, so a failure is logged, not raised."""
    try:
        await sending
    except Exception as exc:
        logger.info("a cancelled request's last message was not delivered: %s", exc)
