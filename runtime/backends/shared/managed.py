"""What the managed-server backends share: the engine, keyed by a ``ServerProfile``.

The spec side (the definition fields, the command's shape, ``ManagedServerSpec``) is
``runtime.backends.shared.server_spec``.

One replica is one server process (``runtime.supervisor``): ``load`` picks the
port, builds the exact command line from the effective config (the profile's
``build``), starts the server and polls its health endpoint until it answers
200.  A ``ForwardedRequest`` (the client's own body: chat completions,
completions) is forwarded as it is, model renamed
(``runtime.backends.shared.forwarding``; streamed from a server that notices a client
that left only while it streams, and given back whole), and the server's chunks
or answer come back as they are; a typed request (/v1/responses) goes to the server's
``/v1/chat/completions`` translated (``runtime.backends.shared.openai_chat``; streamed
when the client streams, or always where the profile says so) and comes back as
``TextDelta`` / ``Finished``.  Both go over one pooled client
(``runtime.backends.shared.upstream``: aiohttp's, raising httpx's transport errors).

A server that exits while loaded reports to ``context["on_engine_failure"]``
(the model moves to failed, its queue gets backend_error); requests in flight
lose their connection at once and end with a ``backend_error`` that names the
exit code and the tail of the server's output.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from runtime.backends.base import Finished, TextDelta, resolve_model_path
from runtime.backends.shared.forwarding import answer_bound, forward
from runtime.backends.shared.openai_chat import chat_completion, chat_request, required_for_named
from runtime.backends.shared.openai_audio import create_transcription
from runtime.backends.shared.openai_embeddings import create_embeddings
from runtime.backends.shared.upstream_rerank import create_rerank
from runtime.backends.shared.prompts import template_variables
from runtime.backends.shared.upstream import UpstreamClient
from runtime.errors import BackendError, InvalidLoadRequest
from runtime.inputs.request import ForwardedRequest, GenerationRequest, InferenceRequest, typed_request
from runtime.inputs.transcription import Transcribed, TranscriptionRequest, TranscriptSegment
from runtime.model.load_progress import STAGE_HEALTHY, STAGE_LISTENING, STAGE_LOADING_WEIGHTS, STAGE_SPAWNED
from runtime.model.load_progress import report as report_progress
from runtime.pool.devices import cuda_visible_devices
from runtime.supervisor import (
    ManagedProcess,
    ServerCommand,
    ServerStartError,
    choose_port,
    connect_host,
    describe_exit,
    server_env,
)

KEEPALIVE_SECONDS = 2.0


@dataclass(frozen=True)
class LaunchSite:
    """Where one replica's server runs and may keep temporary files."""

    host: str
    port: int
    base_dir: str
    scratch_dir: Path
    stem: str  # "<runtime pid>-<model>.r<replica>": prefix of the load's temporary files
    slot_save_path: str | None = None  # where the server saves its slots (llama_server), None: nowhere


@dataclass(frozen=True)
class ServerLaunch:
    argv: list[str]
    temp_files: tuple[Path, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # set in the server's environment over the definition's


@dataclass(frozen=True)
class ServerProfile:
    """How one managed backend starts its server and talks to it.

    ``prefix`` is the backend's name and the prefix of its ``server_fields``.
    ``served_model`` gives what the server loads, which is also the model name
    its API answers to; by default ``server_target``.
    """

    program: str
    prefix: str
    build: Callable[[dict[str, Any], LaunchSite], ServerLaunch]
    served_model: Callable[[dict[str, Any], str], str] | None = None
    # A request to a model with LoRA adapters (runtime.backends.shared.adapters): (config, the
    # served model's name, the request's adapter or None) -> (the model name the server gets,
    # the body fields that select the adapter, or none).
    adapter_request: Callable[[dict[str, Any], str, str | None], tuple[str, dict]] | None = None
    # Forward a json_schema text.format as the chat response_format.
    json_schema: bool = False
    health_path: str = "/health"
    # Stream every upstream call, even for a client that does not stream: for a server that
    # notices a closed connection only while it streams, so a cancelled request stops there too.
    stream_always: bool = False
    # With stream_always: the definition field whose value is the most tokens a non-streamed
    # call's answer may be held to and still go unstreamed (``streams_upstream``); None: none does.
    unstreamed_max_tokens_field: str | None = None
    # False: the server reads a named function as tool_choice as "auto"; a chat body that names
    # one is sent with that function alone and "required" (openai_chat.required_for_named).
    named_tool_choice: bool = True
    # The chat body's name of the typed request's repeat_penalty (openai_chat.chat_request).
    repeat_penalty_field: str = "repetition_penalty"

    def streams_upstream(self, config: dict[str, Any], stream: bool, max_tokens: int | None) -> bool:
        """Whether a call goes to the server streamed: the client's own stream, or with
        ``stream_always`` a non-streamed one too, unless its answer is held to ``max_tokens`` (None:
        unbounded) no more than the definition's ``unstreamed_max_tokens_field`` allows.  Such a
        short answer costs less unstreamed (about 1 ms here: one write instead of a chunk per event,
        and a kept-alive connection where llama-server closes one after each stream), and if its
        client leaves, the server finishes at most that many tokens for nobody."""
        if stream or not self.stream_always:
            return stream
        short = config.get(self.unstreamed_max_tokens_field, 0) if self.unstreamed_max_tokens_field else 0
        return max_tokens is None or max_tokens > short

    def model_name(self, config: dict[str, Any], base_dir: str) -> str:
        if self.served_model is not None:
            return self.served_model(config, base_dir)
        return server_target(config, self.prefix, base_dir)


# A server's own words for reading its weights (llama-server, vLLM, SGLang, TensorRT-LLM), and
# a percentage on such a line (vLLM's and SGLang's "Loading safetensors checkpoint shards: 50% ...").
LOADING_WEIGHTS_LINE = re.compile(
    r"load_tensors|loading model|llama_model_load|Loading weights|Loading safetensors|Loading model weights", re.I
)
PERCENT = re.compile(r"(\d{1,3})%")
START_POLL_SECONDS = 0.1


async def watch_start(process: ManagedProcess, host: str, port: int, context: dict) -> None:
    """Until cancelled (the server is healthy): ``listening`` once its port takes a connection,
    ``loading_weights`` while its output says so (with the line's percentage, if any)."""
    listening = False
    after = None
    while True:
        lines, after = process.output_since(after, 200)
        if not listening:
            try:
                async with asyncio.timeout(1.0):
                    _, writer = await asyncio.open_connection(host, port)
            except (OSError, TimeoutError):
                pass
            else:
                writer.close()
                listening = True
                report_progress(context, STAGE_LISTENING)
        for line in lines:
            if LOADING_WEIGHTS_LINE.search(line):
                percent = PERCENT.search(line)
                report_progress(context, STAGE_LOADING_WEIGHTS, int(percent.group(1)) / 100 if percent else None)
        await asyncio.sleep(START_POLL_SECONDS)


class ManagedServerEngine:
    """One replica of a managed backend: its own server process and a pooled client to it.

    ``load`` raises ServerStartError (the load fails) when the port is taken, the
    binary cannot run, the server exits before it answers its health check, or
    the startup timeout passes.  ``unload`` stops the process group and removes
    the load's temporary files; it is safe after a failed load and twice.
    """

    def __init__(self, profile: ServerProfile, model_name: str, config: dict, replica_index: int, context: dict):
        self.profile = profile
        self.model_name = model_name
        self.config = config
        self.replica_index = replica_index
        self.context = context
        self.label = f"{profile.program} for model {model_name}, replica {replica_index + 1}"
        self.process: ManagedProcess | None = None
        self.base_url: str | None = None
        self._client: UpstreamClient | None = None
        self._served_model = profile.model_name(config, context["base_dir"])
        self._failure: str | None = None
        self._report: asyncio.Task | None = None  # the death report, kept referenced until it ran
        self._loaded = False
        self._stopping = False
        self.slot_save_path: str | None = None  # the LaunchSite's (a subclass that saves slots sets it)

    def _field(self, name: str) -> Any:
        return self.config[f"{self.profile.prefix}_{name}"]

    def _placement_env(self) -> dict[str, str]:
        """The definition's env, with CUDA_VISIBLE_DEVICES of the load's GPU placement (the
        pool's choice wins over one set there; on cpu the environment is left as it is)."""
        visible = cuda_visible_devices(self.config.get("placement"))
        env = dict(self._field("env"))
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        return env

    @property
    def _auth(self) -> dict[str, str]:
        key = self._field("api_key")
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def load(self) -> None:
        """Start the server and wait until it is healthy; raise ServerStartError otherwise."""
        host = self._field("host")
        port = choose_port(host, self._field("port"), self.replica_index)
        state_dir = Path(self.context["state_dir"])
        site = LaunchSite(
            host=host,
            port=port,
            base_dir=self.context["base_dir"],
            scratch_dir=state_dir / "tmp",
            stem=f"{os.getpid()}-{self.model_name}.r{self.replica_index}",
            slot_save_path=self.slot_save_path,
        )
        site.scratch_dir.mkdir(parents=True, exist_ok=True)
        try:
            launch = self.profile.build(self.config, site)
        except (OSError, ValueError) as exc:
            raise ServerStartError(f"{self.label}: {exc}") from None
        command = ServerCommand(
            label=self.label,
            argv=launch.argv,
            env=server_env({**self._placement_env(), **launch.env}, self._field("library_path")),
            log_path=state_dir / "logs" / f"{self.model_name}.r{self.replica_index}.log",
            temp_files=launch.temp_files,
        )
        self.process = ManagedProcess(command, state_dir)
        self.base_url = f"http://{connect_host(host)}:{port}"
        watching = None
        try:
            await self.process.start()
            self.process.on_exit(self._server_exited)
            report_progress(self.context, STAGE_SPAWNED)
            watching = asyncio.get_running_loop().create_task(watch_start(self.process, connect_host(host), port,
                                                                          self.context))
            await self.process.wait_ready(
                self.base_url + self.profile.health_path, self._field("startup_timeout_seconds"), self._auth
            )
            watching.cancel()
            report_progress(self.context, STAGE_HEALTHY, 1.0)
            if not self.process.running:  # it exited right after answering: its exit went unreported
                await self.process.output_settled()
                raise ServerStartError(self.process.exit_report("right after it was ready"))
        except BaseException:
            await self._release()
            raise
        finally:
            if watching is not None:
                watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)
        self._client = server_client(self.base_url, self._auth)
        self._loaded = True

    async def unload(self) -> None:
        self._stopping = True
        await self._release()

    async def restart(self, config: dict) -> None:
        """Stop the server (its exit is no failure) and start it as ``load`` does with ``config``,
        which the engine then keeps (a restart-mode reconfigure, runtime.model.residency); raises
        ServerStartError as ``load`` does, with nothing left running."""
        self._loaded = False
        await self._release()
        self.config = config
        self._served_model = self.profile.model_name(config, self.context["base_dir"])
        await self.load()

    async def reconfigure(self, config: dict) -> None:
        """A restart-mode reconfigure: ``restart`` with ``config``; when the server does not come up,
        start it again with the old config and raise InvalidLoadRequest (BackendError when even
        that fails)."""
        old = self.config
        try:
            await self.restart(config)
        except ServerStartError as exc:
            reason = str(exc)
        else:
            return
        try:
            await self.restart(old)
        except ServerStartError as again:
            raise BackendError(
                f"{self.label} did not start with the new arguments ({reason}), nor again with the old ones: {again}"
            ) from None
        raise InvalidLoadRequest(
            f"{self.label} did not start with the new arguments, so it was started again with the old ones: {reason}"
        )

    async def _release(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self.process is not None:
            await self.process.stop()

    def _server_exited(self, process: ManagedProcess) -> None:
        if self._loaded and not self._stopping:
            # What later requests are told; the server's output goes to last_error alone (an
            # operator's detail: paths, stacks).
            self._failure = f"{self.label} {describe_exit(process.returncode)} while loaded"
            self._report = asyncio.get_running_loop().create_task(self._report_death(process))

    async def _report_death(self, process: ManagedProcess) -> None:
        await process.output_settled()
        self.context["on_engine_failure"](process.exit_report("while loaded"))

    async def generate(self, request: InferenceRequest) -> AsyncIterator[TextDelta | Finished]:
        if self._failure is not None:
            raise BackendError(self._failure)
        if self._client is None:
            raise BackendError(f"{self.label} is not loaded")
        for attempt in (1, 2):
            answered = False
            try:
                async with contextlib.aclosing(self._upstream(request)) as upstream:  # closed with this one
                    async for event in upstream:
                        answered = True
                        yield event
                return
            except httpx.TransportError as exc:
                # Once more on a fresh connection when a kept-alive one was closed under us
                # (nothing came back yet and the server still runs); otherwise the request fails.
                if answered or attempt == 2 or not self.process.running:
                    raise await self._connection_lost(exc) from None

    def _upstream(self, request: InferenceRequest) -> AsyncIterator[Any]:
        """The server's answer: the client's own body forwarded, or the typed request as a chat
        completion."""
        thinking = self.config.get("enable_thinking")
        model, adapter_fields = self._served_model, {}
        if self.config.get("adapters"):
            model, adapter_fields = self.profile.adapter_request(
                self.config, self._served_model, typed_request(request).adapter)
        match request:
            case ForwardedRequest(typed=typed, path=path, body=body):
                if path == "/v1/chat/completions" and not self.profile.named_tool_choice:
                    body = required_for_named(body)
                return forward(
                    self._client, path, {**body, **adapter_fields}, model, self.label, BackendError,
                    template_variables(typed, thinking),
                    stream_upstream=self.profile.streams_upstream(self.config, False, answer_bound(body)),
                )
            case GenerationRequest():
                body = chat_request(
                    request,
                    model,
                    configured_thinking=thinking,
                    json_schema=self.profile.json_schema,
                    stream=self.profile.streams_upstream(self.config, request.stream, request.max_output_tokens),
                    named_tool_choice=self.profile.named_tool_choice,
                    repeat_penalty_field=self.profile.repeat_penalty_field,
                ) | adapter_fields
                return chat_completion(self._client, "/v1/chat/completions", body, self.label, BackendError)

    async def embed(self, inputs, *, dimensions: int | None = None) -> tuple[list[list[float]], int]:
        """POST the server's /v1/embeddings (``embeddings: true``), the model name rewritten to
        the one it serves; once more on a fresh connection, as for generate."""
        return await self._posted(lambda: create_embeddings(
            self._client, "/v1/embeddings", self._served_model, inputs, dimensions, self.label, BackendError
        ))

    async def rerank(self, query: str, documents: list[str]) -> tuple[list[float], int]:
        """POST the server's /v1/rerank (``rerank: true``: llama-server started with --reranking,
        vLLM's pooling runner), the model name rewritten to the one it serves; once more on a
        fresh connection, as for generate."""
        return await self._posted(lambda: create_rerank(
            self._client, "/v1/rerank", self._served_model, query, documents, self.label, BackendError
        ))

    async def _posted(self, call):
        """``await call()`` against the loaded server, once more when the first connection failed."""
        if self._failure is not None:
            raise BackendError(self._failure)
        if self._client is None:
            raise BackendError(f"{self.label} is not loaded")
        for attempt in (1, 2):
            try:
                return await call()
            except httpx.TransportError as exc:
                if attempt == 2 or not self.process.running:
                    raise await self._connection_lost(exc) from None

    async def transcribe(self, request: TranscriptionRequest) -> AsyncIterator[TranscriptSegment | Transcribed]:
        """POST the server's /v1/audio/transcriptions or /translations (``audio_transcription:
        true``), the model name rewritten to the one it serves; its segments, then their end."""
        if self._failure is not None:
            raise BackendError(self._failure)
        if self._client is None:
            raise BackendError(f"{self.label} is not loaded")
        try:
            segments, done = await create_transcription(
                self._client, self._served_model, request, self.label, BackendError
            )
        except httpx.TransportError as exc:
            raise await self._connection_lost(exc) from None
        for segment in segments:
            yield segment
        yield done

    async def _connection_lost(self, exc: httpx.TransportError) -> BackendError:
        """The request's error: how the server ended, not its output (last_error has that)."""
        if self.process is not None and await self.process.wait_exit(1.0):
            return BackendError(f"{self.label} {describe_exit(self.process.returncode)} while generating")
        return BackendError(f"lost the connection to {self.label}: {exc!r}")


def server_client(base_url: str, headers: dict[str, str] | None = None) -> UpstreamClient:
    """The pooled client an engine talks to its server with: aiohttp's behind httpx's interface
    (``runtime.backends.shared.upstream``), about 0.6 ms of CPU a call less than httpx
    (docs/performance.md).  Idle connections are dropped before llama-server's (cpp-httplib's)
    5 s keep-alive ends; a stream's connection is never pooled."""
    return UpstreamClient(base_url, headers, connect_timeout=10.0, keepalive_seconds=KEEPALIVE_SECONDS)


def model_target(path: str, base_dir: str) -> str:
    """A local model (relative to the settings file's folder) when it exists, else the hub id as given."""
    resolved = resolve_model_path(path, base_dir)
    return resolved if os.path.exists(resolved) else path


def server_target(config: dict[str, Any], prefix: str, base_dir: str) -> str:
    """What a server with a ``<prefix>_model`` field loads: that field, else ``model_path``."""
    return model_target(config[f"{prefix}_model"] or config["model_path"], base_dir)
