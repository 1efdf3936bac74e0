"""Prompt helpers shared by the engines that template chats themselves and by the chat clients.

- ``TEXT_PARTS`` and ``CHAT_ROLES``: the Responses API content types that hold
  text, and its roles as chat templates and chat APIs name them.
- ``template_messages``: a ``GenerationRequest`` as the ``[{"role", "content"}]``
  list a Hugging Face chat template expects (instructions first, as the system
  message; text only).
- ``template_variables``: the ``enable_thinking`` switch for a request, from the
  request's ``thinking`` or else the definition's ``enable_thinking``.
- ``render_template_prompt``: a chat template rendered in the sandbox of
  ``runtime.inputs.chat_templates``; a template that refuses the messages is the
  request's fault (400), one the sandbox refuses is the model's (502).
- ``ChatTemplate``: the chat template and special tokens of a Hugging Face
  tokenizer folder.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from runtime.backends.base import GenerationRequest
from runtime.inputs.chat_templates import TemplateRenderError, UnsafeTemplate, render_chat_template
from runtime.errors import BackendError, InvalidRequest, ModalityUnsupported

TEXT_PARTS = ("input_text", "output_text", "text")
# Responses API roles as chat templates and chat APIs know them.
CHAT_ROLES = {"developer": "system"}


def template_messages(request: GenerationRequest) -> list[dict]:
    """The request as chat-template messages; non-text parts are refused (400)."""
    messages = [{"role": "system", "content": request.instructions}] if request.instructions else []
    for message in request.messages:
        texts = []
        for part in message["content"]:
            if part.get("type") not in TEXT_PARTS:
                raise ModalityUnsupported(
                    f"this engine takes text input only (got {part.get('type')})", param="input"
                )
            texts.append(part.get("text", ""))
        role = CHAT_ROLES.get(message["role"], message["role"])
        messages.append({"role": role, "content": "".join(texts)})
    return messages


def template_variables(request: GenerationRequest, configured_thinking: bool | None) -> dict:
    """``{"enable_thinking": bool}`` when the request or the definition decides it, else ``{}``.

    The service has already refused ``enabled``/``disabled`` for models whose
    capabilities do not list them, so here they are always safe to apply.
    """
    if request.thinking == "enabled":
        return {"enable_thinking": True}
    if request.thinking == "disabled":
        return {"enable_thinking": False}
    if configured_thinking is not None:
        return {"enable_thinking": configured_thinking}
    return {}


def render_template_prompt(template: str, messages: list[dict], **variables) -> str:
    """The prompt text for ``messages`` with the generation prompt appended."""
    try:
        return render_chat_template(template, messages, **variables)
    except UnsafeTemplate as exc:
        raise BackendError(f"the model's chat template is refused: {exc}") from exc
    except TemplateRenderError as exc:
        raise InvalidRequest(f"the model's chat template refused these messages: {exc}", param="input") from exc


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json stores it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value


@dataclass(frozen=True)
class ChatTemplate:
    template: str
    bos_token: str | None = None
    eos_token: str | None = None

    @classmethod
    def from_folder(cls, folder: str) -> ChatTemplate:
        """Read ``tokenizer_config.json`` (and ``chat_template.jinja`` where the template lives
        on its own, as newer Hugging Face releases save it); ValueError when there is none."""
        config_path = os.path.join(folder, "tokenizer_config.json")
        try:
            with open(config_path, encoding="utf-8") as handle:
                config = json.load(handle)
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read the tokenizer config {config_path}: {exc}") from exc
        template = config.get("chat_template")
        jinja_path = os.path.join(folder, "chat_template.jinja")
        if template is None and os.path.isfile(jinja_path):
            with open(jinja_path, encoding="utf-8") as handle:
                template = handle.read()
        if isinstance(template, list):  # named templates: [{"name", "template"}]
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if not template:
            raise ValueError(f"the tokenizer in {folder} has no chat template")
        return cls(template, _token_text(config.get("bos_token")), _token_text(config.get("eos_token")))

    def render(self, messages: list[dict], **variables) -> str:
        return render_template_prompt(
            self.template, messages, bos_token=self.bos_token or "", eos_token=self.eos_token or "", **variables
        )
