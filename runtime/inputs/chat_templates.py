"""Chat templates that come with model files, rendered in a sandbox.

GGUF files and Hugging Face tokenizer configs carry Jinja chat templates.
They are untrusted input (CVE-2024-34359: a template could reach Python
internals through an unsandboxed environment), so they are rendered only in
Jinja's ``ImmutableSandboxedEnvironment``; a template that touches an unsafe
attribute fails with ``UnsafeTemplate``.
"""
from __future__ import annotations

import json
from datetime import datetime

from jinja2 import TemplateError
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment


class UnsafeTemplate(ValueError):
    """The template tried something the sandbox forbids."""


class TemplateRenderError(ValueError):
    """The template is not valid Jinja, or it raised while rendering."""


def _raise_exception(message: str):
    raise TemplateError(message)


def _tojson(value, indent=None, ensure_ascii=False, **_):
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    environment.filters["tojson"] = _tojson
    return environment


_ENVIRONMENT = _environment()


def render_chat_template(
    template: str, messages: list[dict], *, add_generation_prompt: bool = True, **variables
) -> str:
    """Render ``template`` for ``messages`` ([{"role", "content": str}]) plus extra variables
    (bos_token, eos_token, enable_thinking, ...)."""
    try:
        compiled = _ENVIRONMENT.from_string(template)
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
    except SecurityError as exc:
        raise UnsafeTemplate(f"the chat template was refused by the sandbox: {exc}") from exc
    except TemplateError as exc:
        raise TemplateRenderError(f"the chat template failed: {exc}") from exc
