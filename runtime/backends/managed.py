"""The engine shared by the managed-server backends.

One replica is one server process (``runtime.supervisor``): ``load`` picks the
port, builds the exact command line from the effective config (a
``ServerProfile`` per backend), starts the server and polls its health endpoint
until it answers 200.  Requests go to the server's ``/v1/chat/completions`` over
a pooled ``httpx`` client (``runtime.backends.openai_chat``; streamed when the
client streams, or always where the profile says so) and come back as
``TextDelta`` / ``Finished``.

A server that exits while loaded reports to ``context["on_engine_failure"]``
(the model moves to failed, its queue gets backend_error); requests in flight
lose their connection at once and end with a ``backend_error`` that names the
exit code and the tail of the server's output.
"""
from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from runtime.backends.base import Finished, GenerationRequest, TextDelta, resolve_model_path
from runtime.backends.openai_chat import chat_completion, chat_request
from runtime.errors import BackendError
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


@dataclass(frozen=True)
class ServerLaunch:
    argv: list[str]
    temp_files: tuple[Path, ...] = ()


@dataclass(frozen=True)
class ServerProfile:
    """How one managed backend starts its server.

    ``prefix`` names the definition fields every managed backend has:
    ``<prefix>_binary``, ``_host``, ``_port``, ``_api_key``, ``_env``,
    ``_library_path``, ``_extra_args`` and ``_startup_timeout_seconds``.
    """

    program: str
    prefix: str
    build: Callable[[dict[str, Any], LaunchSite], ServerLaunch]
    served_model: Callable[[dict[str, Any], str], str]
    json_schema: bool = False
    health_path: str = "/health"
    # Stream every upstream call, even for a client that does not stream: for a server that
    # notices a closed connection only while it streams, so a cancelled request stops there too.
    stream_always: bool = False


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
        self._client: httpx.AsyncClient | None = None
        self._served_model = profile.served_model(config, context["base_dir"])
        self._failure: str | None = None
        self._report: asyncio.Task | None = None  # the death report, kept referenced until it ran
        self._loaded = False
        self._stopping = False

    def _field(self, name: str) -> Any:
        return self.config[f"{self.profile.prefix}_{name}"]

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
        )
        site.scratch_dir.mkdir(parents=True, exist_ok=True)
        try:
            launch = self.profile.build(self.config, site)
        except (OSError, ValueError) as exc:
            raise ServerStartError(f"{self.label}: {exc}") from None
        command = ServerCommand(
            label=self.label,
            argv=launch.argv,
            env=server_env(self._field("env"), self._field("library_path")),
            log_path=state_dir / "logs" / f"{self.model_name}.r{self.replica_index}.log",
            temp_files=launch.temp_files,
        )
        self.process = ManagedProcess(command, state_dir)
        self.base_url = f"http://{connect_host(host)}:{port}"
        try:
            await self.process.start()
            self.process.on_exit(self._server_exited)
            await self.process.wait_ready(
                self.base_url + self.profile.health_path, self._field("startup_timeout_seconds"), self._auth
            )
            if not self.process.running:  # it exited right after answering: its exit went unreported
                await self.process.output_settled()
                raise ServerStartError(self.process.exit_report("right after it was ready"))
        except BaseException:
            await self._release()
            raise
        self._client = server_client(self.base_url, self._auth)
        self._loaded = True

    async def unload(self) -> None:
        self._stopping = True
        await self._release()

    async def _release(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self.process is not None:
            await self.process.stop()

    def _server_exited(self, process: ManagedProcess) -> None:
        if self._loaded and not self._stopping:
            self._failure = f"{self.label} {describe_exit(process.returncode)} while loaded"
            self._report = asyncio.get_running_loop().create_task(self._report_death(process))

    async def _report_death(self, process: ManagedProcess) -> None:
        await process.output_settled()
        self._failure = process.exit_report("while loaded")
        self.context["on_engine_failure"](self._failure)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TextDelta | Finished]:
        if self._failure is not None:
            raise BackendError(self._failure)
        if self._client is None:
            raise BackendError(f"{self.label} is not loaded")
        body = chat_request(
            request,
            self._served_model,
            configured_thinking=self.config.get("enable_thinking"),
            json_schema=self.profile.json_schema,
            stream=request.stream or self.profile.stream_always,
        )
        for attempt in (1, 2):
            answered = False
            try:
                upstream = chat_completion(self._client, "/v1/chat/completions", body, self.label, BackendError)
                async for event in upstream:
                    answered = True
                    yield event
                return
            except httpx.TransportError as exc:
                # Once more on a fresh connection when a kept-alive one was closed under us
                # (nothing came back yet and the server still runs); otherwise the request fails.
                if answered or attempt == 2 or not self.process.running:
                    raise await self._connection_lost(exc) from None

    async def _connection_lost(self, exc: httpx.TransportError) -> BackendError:
        if self.process is not None and await self.process.wait_exit(1.0):
            await self.process.output_settled()
            return BackendError(self.process.exit_report("while generating"))
        return BackendError(f"lost the connection to {self.label}: {exc!r}")


def server_client(base_url: str, headers: dict[str, str] | None = None) -> httpx.AsyncClient:
    """The pooled client an engine talks to its server with."""
    return httpx.AsyncClient(
        base_url=base_url,
        headers=headers or {},
        timeout=httpx.Timeout(None, connect=10.0),
        # Idle connections are dropped before llama-server's (cpp-httplib's) 5 s keep-alive ends.
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=KEEPALIVE_SECONDS),
        trust_env=False,
    )


def model_target(path: str, base_dir: str) -> str:
    """A local model (relative to the settings file's folder) when it exists, else the hub id as given."""
    resolved = resolve_model_path(path, base_dir)
    return resolved if os.path.exists(resolved) else path


def flag_args(*pairs: tuple[str, Any]) -> list[str]:
    """``[flag, value, ...]`` for every pair whose value is not None."""
    args: list[str] = []
    for flag, value in pairs:
        if value is not None:
            args += [flag, str(value)]
    return args
