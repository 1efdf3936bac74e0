"""The engine shared by the managed-server backends, and the OpenAI-compatible client they speak.

One replica is one server process (``runtime.supervisor``): ``load`` picks the
port, builds the exact command line from the effective config (a
``ServerProfile`` per backend), starts the server and polls its health endpoint
until it answers 200.  Requests go to the server's ``/v1/chat/completions`` over
a pooled ``httpx`` client (streamed when the client streams, or always where the
profile says so) and come back as ``TextDelta`` / ``Finished``.

A server that exits while loaded reports to ``context["on_engine_failure"]``
(the model moves to failed, its queue gets backend_error); requests in flight
lose their connection at once and end with a ``backend_error`` that names the
exit code and the tail of the server's output.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from runtime.backends.base import Finished, GenerationRequest, TextDelta, resolve_model_path
from runtime.backends.prompts import template_variables
from runtime.errors import BackendError, ContextLengthExceeded, FileInputUnsupported, InvalidRequest, LLMPoolError
from runtime.supervisor import (
    ManagedProcess,
    ServerCommand,
    ServerStartError,
    choose_port,
    connect_host,
    describe_exit,
    server_env,
)

TEXT_PARTS = ("input_text", "output_text", "text")
CHAT_ROLES = {"developer": "system"}
# Upstream statuses that mean the request itself was refused (too long, malformed).
REQUEST_REJECTED = (400, 413, 422)
KEEPALIVE_SECONDS = 2.0
# How llama-server, vLLM, SGLang and OpenAI word a prompt that does not fit the context.
CONTEXT_OVERFLOW = re.compile(r"context (length|size|window)|exceeds? the available context", re.IGNORECASE)


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


# ---- the OpenAI-compatible client --------------------------------------------------------


def chat_request(
    request: GenerationRequest,
    model: str,
    *,
    configured_thinking: bool | None = None,
    json_schema: bool = False,
    file_part: Callable[[dict], dict] | None = None,
    stream: bool | None = None,
) -> dict:
    """The ``/v1/chat/completions`` body for ``request``: streamed (with usage) when ``stream``
    (by default: when the client streams), else one answer, which spares the upstream and us a
    chunk per token."""
    stream = request.stream if stream is None else stream
    body = {
        "model": model,
        "messages": chat_messages(request, file_part),
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
        "max_tokens": request.max_output_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
    }
    template_kwargs = template_variables(request, configured_thinking)
    if template_kwargs:
        body["chat_template_kwargs"] = template_kwargs
    response_format = request.response_format
    if json_schema and response_format and response_format.get("type") == "json_schema":
        body["response_format"] = chat_response_format(response_format)
    return body


def chat_messages(request: GenerationRequest, file_part: Callable[[dict], dict] | None = None) -> list[dict]:
    """Responses API messages as chat messages; instructions first, as the system message."""
    messages = [{"role": "system", "content": request.instructions}] if request.instructions else []
    for message in request.messages:
        parts = [_chat_part(part, file_part) for part in message["content"]]
        if all(part["type"] == "text" for part in parts):
            content: str | list = "".join(part["text"] for part in parts)
        else:
            content = parts
        messages.append({"role": CHAT_ROLES.get(message["role"], message["role"]), "content": content})
    return messages


def _chat_part(part: dict, file_part: Callable[[dict], dict] | None) -> dict:
    kind = part.get("type")
    if kind in TEXT_PARTS:
        return {"type": "text", "text": part.get("text", "")}
    if kind == "input_image":
        if not part.get("image_url"):
            raise InvalidRequest("input_image parts need an image_url for this model", param="input")
        image = {"url": part["image_url"]}
        if part.get("detail"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_audio":
        return {"type": "input_audio", "input_audio": part.get("input_audio") or {}}
    if kind == "input_file" and file_part is not None:
        return file_part(part)
    raise FileInputUnsupported(f"this model does not accept {kind} content", param="input")


def chat_response_format(response_format: dict) -> dict:
    """A Responses API ``text.format`` json_schema as the chat completions ``response_format``."""
    if "json_schema" in response_format:
        return {"type": "json_schema", "json_schema": response_format["json_schema"]}
    schema = {"name": response_format.get("name") or "response", "schema": response_format["schema"]}
    if "strict" in response_format:
        schema["strict"] = response_format["strict"]
    return {"type": "json_schema", "json_schema": schema}


async def chat_completion(
    client: httpx.AsyncClient, url: str, body: dict, upstream: str, failure: type[LLMPoolError]
) -> AsyncIterator[TextDelta | Finished]:
    """POST ``body`` (streamed or not, as it says) and translate the answer into deltas and the end."""
    if body.get("stream"):
        async for event in stream_chat(client, url, body, upstream, failure):
            yield event
        return
    response = await client.post(url, json=body)
    if response.status_code != 200:
        raise upstream_error(response.status_code, response.content, upstream, failure)
    try:
        answer = response.json()
    except ValueError:
        raise failure(f"{upstream} answered 200 with a body that is not JSON") from None
    if not isinstance(answer, dict):
        raise failure(f"{upstream} answered 200 with {type(answer).__name__}, not a chat completion")
    if answer.get("error"):
        raise failure(f"{upstream} failed while generating: {_error_text(answer)}")
    choices = answer.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        raise failure(f"{upstream} answered without a choice")
    text = (choices[0].get("message") or {}).get("content") or ""
    if text:
        yield TextDelta(text)
    usage = answer.get("usage") or {}
    yield Finished(
        input_tokens=usage.get("prompt_tokens") or 0,
        # An upstream that reports no usage: about four characters a token, as the scheduler estimates.
        output_tokens=usage.get("completion_tokens") or (max(1, len(text) // 4) if text else 0),
        finish_reason="length" if choices[0].get("finish_reason") == "length" else "stop",
    )


async def stream_chat(
    client: httpx.AsyncClient, url: str, body: dict, upstream: str, failure: type[LLMPoolError]
) -> AsyncIterator[TextDelta | Finished]:
    """POST a streamed chat completion and translate its SSE events; ``failure`` is the error class."""
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            raise upstream_error(response.status_code, await response.aread(), upstream, failure)
        finish, usage, pieces, done = None, None, 0, False
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if chunk.get("error"):
                raise failure(f"{upstream} failed while generating: {_error_text(chunk)}")
            for choice in chunk.get("choices") or ():
                text = (choice.get("delta") or {}).get("content")
                if text:
                    pieces += 1
                    yield TextDelta(text)
                finish = choice.get("finish_reason") or finish
            usage = chunk.get("usage") or usage
        if finish is None and not done:
            raise failure(f"{upstream} ended the stream without a finish reason")
    yield Finished(
        input_tokens=(usage or {}).get("prompt_tokens") or 0,
        output_tokens=(usage or {}).get("completion_tokens") or pieces,
        finish_reason="length" if finish == "length" else "stop",
    )


def upstream_error(status: int, body: bytes, upstream: str, failure: type[LLMPoolError]) -> LLMPoolError:
    """An upstream error answer as our error: a refused request is 400, anything else ``failure``."""
    try:
        detail = _error_text(json.loads(body))
    except ValueError:
        detail = body.decode("utf-8", "replace").strip()[:500] or "(empty body)"
    message = f"{upstream} answered {status}: {detail}"
    if status in REQUEST_REJECTED:
        if CONTEXT_OVERFLOW.search(detail):
            return ContextLengthExceeded(message, param="input")
        return InvalidRequest(message, param="input")
    return failure(message)


def _error_text(payload: Any) -> str:
    """The message of an OpenAI-style ``{"error": {"message"}}`` body (or of a looser one)."""
    if not isinstance(payload, dict):
        return str(payload)
    error = payload.get("error")
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error or payload.get("message") or payload.get("detail") or payload)
