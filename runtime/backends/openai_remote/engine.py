"""The openai_remote engine: requests forwarded to a remote OpenAI-compatible chat API.

Nothing runs locally.  ``load`` resolves the API key (``remote_api_key``, or the
environment variable named by ``remote_api_key_env``: a load fails when that
variable is unset) and opens a pooled ``httpx`` client on ``remote_base_url``;
``generate`` forwards a ``ForwardedRequest`` (the client's own body) to the same
path under ``remote_base_url`` (``runtime.backends.shared.forwarding``: model
renamed to ``remote_model``), and sends a typed request (/v1/responses) to
``<remote_base_url>/chat/completions`` translated.

File inputs (only with ``remote_file_mode``): ``inline`` sends ``file_data`` /
``file_id`` as chat ``file`` parts; ``upload`` first uploads each ``file_data``
to ``<remote_base_url>/files`` (purpose ``user_data``), sends its id, and
deletes the upload when the request ends.

Upstream errors keep their message: a refused request (400, 413, 422) is our
400 ``invalid_request``; any other status, a timeout or an unreachable remote
is a 502 ``upstream_error``.
"""
from __future__ import annotations

import base64
import binascii
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx

from runtime.backends.base import Finished, GenerationRequest, TextDelta
from runtime.backends.shared.forwarding import forward
from runtime.backends.shared.openai_chat import chat_completion, chat_request, upstream_error
from runtime.backends.shared.openai_embeddings import create_embeddings
from runtime.backends.shared.upstream_rerank import create_rerank
from runtime.backends.shared.prompts import template_variables
from runtime.inputs.request import ForwardedRequest, InferenceRequest
from runtime.errors import InvalidRequest, UpstreamError


class OpenaiRemoteEngine:
    def __init__(self, model_name: str, config: dict[str, Any]):
        self.model_name = model_name
        self.config = config
        self.base_url = config["remote_base_url"].rstrip("/")
        self.label = f"the remote of model {model_name} ({self.base_url})"
        self._client: httpx.AsyncClient | None = None

    async def load(self) -> None:
        headers = dict(self.config["remote_headers"])
        key = self.config["remote_api_key"]
        variable = self.config["remote_api_key_env"]
        if variable is not None:
            key = os.environ.get(variable)
            if not key:
                raise RuntimeError(f"the environment variable {variable} (remote_api_key_env) is not set")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.AsyncClient(
            base_url=self.base_url + "/",
            headers=headers,
            timeout=httpx.Timeout(self.config["remote_timeout_seconds"]),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )

    async def unload(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def generate(self, request: InferenceRequest) -> AsyncIterator[TextDelta | Finished]:
        if self._client is None:
            raise UpstreamError(f"model {self.model_name} is not loaded")
        uploads: dict[int, str] = {}
        try:
            if isinstance(request, ForwardedRequest):
                # remote_base_url ends with the API version (.../v1), which the path begins with.
                path = request.path.removeprefix("/v1/")
                thinking = template_variables(request.typed, self.config.get("enable_thinking"))
                upstream = forward(self._client, path, request.body, self.config["remote_model"],
                                   self.label, UpstreamError, thinking)
                async with contextlib.aclosing(upstream):  # closing this generator closes the upstream call
                    async for event in upstream:
                        yield event
                return
            if self.config["remote_file_mode"] == "upload":
                await self._upload_files(request, uploads)
            body = chat_request(
                request,
                self.config["remote_model"],
                configured_thinking=self.config.get("enable_thinking"),
                file_part=lambda part: _file_part(part, uploads.get(id(part))),
            )
            async for event in chat_completion(self._client, "chat/completions", body, self.label, UpstreamError):
                yield event
        except httpx.TransportError as exc:  # timeouts included
            raise self._upstream_error(exc) from None
        finally:
            for file_id in uploads.values():
                with contextlib.suppress(httpx.HTTPError):
                    await self._client.delete(f"files/{file_id}")

    async def embed(self, inputs, *, dimensions: int | None = None) -> tuple[list[list[float]], int]:
        """POST ``<remote_base_url>/embeddings`` with ``remote_model`` (``embeddings: true``)."""
        return await self._posted(lambda: create_embeddings(
            self._client, "embeddings", self.config["remote_model"], inputs, dimensions, self.label, UpstreamError
        ))

    async def rerank(self, query: str, documents: list[str]) -> tuple[list[float], int]:
        """POST ``<remote_base_url>/rerank`` with ``remote_model`` (``rerank: true``: a remote that
        serves the Jina / Cohere rerank endpoint there)."""
        return await self._posted(lambda: create_rerank(
            self._client, "rerank", self.config["remote_model"], query, documents, self.label, UpstreamError
        ))

    async def _posted(self, call):
        if self._client is None:
            raise UpstreamError(f"model {self.model_name} is not loaded")
        try:
            return await call()
        except httpx.TransportError as exc:  # timeouts included
            raise self._upstream_error(exc) from None

    def _upstream_error(self, exc: httpx.TransportError) -> UpstreamError:
        """A timeout or a transport failure of the remote, as upstream_error."""
        if isinstance(exc, httpx.TimeoutException):
            return UpstreamError(f"{self.label} did not answer within {self.config['remote_timeout_seconds']:g} s")
        return UpstreamError(f"cannot reach {self.label}: {exc!r}")

    async def _upload_files(self, request: GenerationRequest, uploads: dict[int, str]) -> None:
        for message in request.messages:
            for part in message["content"]:
                if part.get("type") == "input_file" and part.get("file_data"):
                    name = part.get("filename") or "input"
                    files = {"file": (name, _decode_file_data(part["file_data"]))}
                    response = await self._client.post("files", files=files, data={"purpose": "user_data"})
                    if response.status_code != 200:
                        raise upstream_error(response.status_code, response.content, self.label, UpstreamError)
                    uploads[id(part)] = response.json()["id"]


def _file_part(part: dict, uploaded_id: str | None) -> dict:
    """A Responses API ``input_file`` as a chat ``file`` part."""
    if uploaded_id is not None:
        return {"type": "file", "file": {"file_id": uploaded_id}}
    if part.get("file_id"):
        return {"type": "file", "file": {"file_id": part["file_id"]}}
    if part.get("file_data"):
        file = {"file_data": part["file_data"]}
        if part.get("filename"):
            file["filename"] = part["filename"]
        return {"type": "file", "file": file}
    raise InvalidRequest("input_file parts need file_data or file_id for this model", param="input")


def _decode_file_data(data: str) -> bytes:
    """The bytes of a ``data:<type>;base64,<...>`` URL or of plain base64."""
    payload = data.split(",", 1)[1] if data.startswith("data:") else data
    try:
        return base64.b64decode(payload, validate=True)
    except binascii.Error:
        raise InvalidRequest("input_file file_data is not valid base64", param="input") from None
