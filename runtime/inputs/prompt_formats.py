"""Prompt formats of the llama_cpp backend: chat messages to the exact text a model family expects.

Every format renders a ``RenderedPrompt``: a sequence of parts, each marked as
markup (control tokens such as ``<|im_start|>`` are parsed as special tokens)
or content (the caller's text, tokenized as plain text so a message cannot
forge a turn).  ``gguf_template`` renders the Jinja template carried in the
GGUF file in the sandbox of ``runtime/inputs/chat_templates.py``; its output is one
markup part, as llama.cpp's own server treats it.

The conversation first becomes ``ChatMessage``s (``conversation_turns``): the
request's ``instructions`` and every system/developer message join into one
leading system message; user, assistant and tool turns follow in order; the text
parts of one message are joined with a newline.

Tools (``render_prompt(..., tools=...)``): a GGUF template that takes ``tools`` gets them,
and the conversation's tool calls and results, as llama.cpp's server passes them (OpenAI
message shape, arguments as an object).  Every other format gets them as text
(``tools_as_text``): the tools described in the system message in the Hermes format (the
one most open models were tuned on), earlier calls as ``<tool_call>`` blocks and results as
``<tool_response>`` user turns; the model then answers in the ``hermes`` format
(``tool_call_format``).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

from runtime.inputs.chat_templates import TemplateRenderError, UnsafeTemplate, render_chat_template
from runtime.errors import BackendError, InvalidRequest
from runtime.inference.tool_calls import detect_format

GENERIC = "generic"
MISTRAL = "mistral_template"
QWEN3 = "qwen3_template"
GEMMA4 = "gemma4_template"
TRANSLATEGEMMA = "translategemma_template"
GGUF_TEMPLATE = "gguf_template"


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system" | "user" | "assistant" | "tool"
    content: str
    tool_calls: tuple[dict, ...] = ()  # an assistant's calls: {"id", "name", "arguments": JSON text}
    tool_call_id: str | None = None  # a tool result: the call it answers


@dataclass(frozen=True)
class RenderedPrompt:
    parts: tuple[tuple[str, bool], ...]  # (text, is_markup)
    # Strings that end the reply besides the model's end-of-generation tokens.
    stop: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.parts)


class _Builder:
    def __init__(self):
        self.parts: list[tuple[str, bool]] = []

    def markup(self, text: str) -> _Builder:
        if text:
            self.parts.append((text, True))
        return self

    def content(self, text: str) -> _Builder:
        if text:
            self.parts.append((text, False))
        return self

    def build(self, stop: tuple[str, ...] = ()) -> RenderedPrompt:
        return RenderedPrompt(tuple(self.parts), stop)


def conversation_turns(instructions: str | None, messages: list[dict]) -> list[ChatMessage]:
    """The request's conversation as one optional leading system message plus user/assistant turns."""
    system = [instructions] if instructions else []
    turns: list[ChatMessage] = []
    for message in messages:
        text = "\n".join(p.get("text", "") for p in message["content"] if p.get("type") == "input_text")
        if message["role"] in ("system", "developer"):
            system.append(text)
        else:
            turns.append(ChatMessage(
                message["role"], text,
                tool_calls=tuple(message.get("tool_calls") or ()), tool_call_id=message.get("tool_call_id"),
            ))
    if system:
        return [ChatMessage("system", "\n\n".join(system)), *turns]
    return turns


def _split_system(messages: list[ChatMessage]) -> tuple[str | None, list[ChatMessage]]:
    if messages and messages[0].role == "system":
        return messages[0].content, messages[1:]
    return None, messages


# ---- generic ---------------------------------------------------------------------------


def render_generic(messages: list[ChatMessage]) -> RenderedPrompt:
    """A plain role-labelled transcript for models without a known chat format (base models too).

    The reply ends where the model starts a new ``User:`` or ``System:`` line.
    """
    builder = _Builder()
    labels = {"system": "System: ", "user": "User: ", "assistant": "Assistant: "}
    for message in messages:
        builder.markup(labels[message.role]).content(message.content.strip()).markup("\n\n")
    builder.markup("Assistant:")
    return builder.build(stop=("\nUser:", "\nSystem:"))


# ---- Mistral (v7 tekken: Mistral Small 3.x) ---------------------------------------------


def render_mistral(messages: list[ChatMessage]) -> RenderedPrompt:
    system, turns = _split_system(messages)
    builder = _Builder().markup("<s>")
    if system is not None:
        builder.markup("[SYSTEM_PROMPT]").content(system).markup("[/SYSTEM_PROMPT]")
    for message in turns:
        if message.role == "user":
            builder.markup("[INST]").content(message.content).markup("[/INST]")
        else:
            builder.content(message.content).markup("</s>")
    return builder.build()


# ---- Qwen3 (ChatML with a thinking switch) ---------------------------------------------


def render_qwen3(messages: list[ChatMessage], thinking: bool | None) -> RenderedPrompt:
    """Qwen3's template: reasoning of earlier replies is dropped; thinking off adds an empty think block.

    ``thinking`` None keeps Qwen3's default (on).
    """
    builder = _Builder()
    for message in messages:
        content = message.content
        if message.role == "assistant":
            content = content.split("</think>")[-1].lstrip("\n")
        builder.markup(f"<|im_start|>{message.role}\n").content(content).markup("<|im_end|>\n")
    builder.markup("<|im_start|>assistant\n")
    if thinking is False:
        builder.markup("<think>\n\n</think>\n\n")
    return builder.build()


# ---- Gemma 4 -----------------------------------------------------------------------------

_GEMMA4_THOUGHT = re.compile(r"<\|channel>.*?<channel\|>", re.DOTALL)


def render_gemma4(messages: list[ChatMessage], thinking: bool | None) -> RenderedPrompt:
    """Gemma 4's template: ``<|think|>`` opens the system turn when thinking is on; off (the default,
    also for ``thinking`` None) closes an empty thought channel right after ``<|turn>model``."""
    system, turns = _split_system(messages)
    builder = _Builder().markup("<bos>")
    if thinking or system is not None:
        builder.markup("<|turn>system\n")
        if thinking:
            builder.markup("<|think|>\n")
        builder.content((system or "").strip()).markup("<turn|>\n")
    for message in turns:
        role = "model" if message.role == "assistant" else message.role
        content = message.content
        if role == "model":
            content = _GEMMA4_THOUGHT.sub("", content)
        builder.markup(f"<|turn>{role}\n").content(content.strip()).markup("<turn|>\n")
    builder.markup("<|turn>model\n")
    if not thinking:
        builder.markup("<|channel>thought\n<channel|>")
    return builder.build()


# ---- TranslateGemma ----------------------------------------------------------------------

# WMT24++ languages TranslateGemma was trained on (ISO 639 base code -> English name);
# region variants (de-DE, pt_BR, zh-TW) resolve through their base code.
TRANSLATEGEMMA_LANGUAGES = {
    "af": "Afrikaans", "ar": "Arabic", "bg": "Bulgarian", "bn": "Bengali", "ca": "Catalan", "cs": "Czech",
    "da": "Danish", "de": "German", "el": "Greek", "en": "English", "es": "Spanish", "et": "Estonian",
    "fa": "Persian", "fi": "Finnish", "fil": "Filipino", "fr": "French", "gu": "Gujarati", "he": "Hebrew",
    "hi": "Hindi", "hr": "Croatian", "hu": "Hungarian", "id": "Indonesian", "is": "Icelandic",
    "it": "Italian", "ja": "Japanese", "kn": "Kannada", "ko": "Korean", "lt": "Lithuanian", "lv": "Latvian",
    "ml": "Malayalam", "mr": "Marathi", "ms": "Malay", "nb": "Norwegian Bokmål", "nl": "Dutch",
    "no": "Norwegian", "pa": "Punjabi", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian",
    "ru": "Russian", "sk": "Slovak", "sl": "Slovenian", "sr": "Serbian", "sv": "Swedish", "sw": "Swahili",
    "ta": "Tamil", "te": "Telugu", "th": "Thai", "tl": "Tagalog", "tr": "Turkish", "uk": "Ukrainian",
    "ur": "Urdu", "vi": "Vietnamese", "zh": "Chinese", "zu": "Zulu",
}
# source_lang_code values (besides an omitted one) that ask for per-segment detection, and the
# valid source code the structured prompt then names.
MIXED_SOURCE_CODES = ("auto", "mixed")
MIXED_SOURCE_FALLBACK = "en"
_LANG_CODE = re.compile(r"^([A-Za-z]{2,3})(?:[-_][A-Za-z0-9]{2,8})*$")


def language_name(code: str, param: str) -> str:
    """English name of a language code, or 400 invalid_request naming ``param``."""
    match = _LANG_CODE.match(code) if isinstance(code, str) else None
    name = TRANSLATEGEMMA_LANGUAGES.get(match.group(1).lower()) if match else None
    if name is None:
        raise InvalidRequest(
            f"{param} {code!r} is not a language code TranslateGemma supports "
            f"(for example en, de-DE, pt_BR; known base codes: {', '.join(sorted(TRANSLATEGEMMA_LANGUAGES))})",
            param=param,
        )
    return name


def render_translategemma(messages: list[ChatMessage], extra: dict) -> RenderedPrompt:
    """The official TranslateGemma user turn built from the structured language codes.

    Single-turn: the last user message is the text to translate; system text is not rendered
    (TranslateGemma has no system turn).  A missing, "auto" or "mixed" ``source_lang_code``
    keeps the structured prompt with the fallback source and prepends a per-segment
    language-detection instruction to the text.
    """
    target_code = extra.get("target_lang_code")
    if not target_code:
        raise InvalidRequest(
            "target_lang_code is required for a translategemma_template model", param="target_lang_code"
        )
    target = language_name(target_code, "target_lang_code")
    source_code = extra.get("source_lang_code")
    text = next((m.content for m in reversed(messages) if m.role == "user"), "").strip()
    if not source_code or str(source_code).strip().lower() in MIXED_SOURCE_CODES:
        source_code = MIXED_SOURCE_FALLBACK
        preface = (
            "The text below may mix several source languages. Detect the source language of each "
            f"segment and translate every segment into {target}."
        )
    else:
        preface = None
    source = language_name(source_code, "source_lang_code")
    instruction = (
        f"You are a professional {source} ({source_code}) to {target} ({target_code}) translator. "
        f"Your goal is to accurately convey the meaning and nuances of the original {source} text while "
        f"adhering to {target} grammar, vocabulary, and cultural sensitivities.\n"
        f"Produce only the {target} translation, without any additional explanations or commentary. "
        f"Please translate the following {source} text into {target}:\n\n\n"
    )
    builder = _Builder().markup("<bos><start_of_turn>user\n").content(instruction)
    if preface:
        builder.content(preface + "\n\n")
    builder.content(text).markup("<end_of_turn>\n<start_of_turn>model\n")
    return builder.build()


# ---- the GGUF's own template ---------------------------------------------------------------


@dataclass(frozen=True)
class GgufChatTemplate:
    template: str
    bos_token: str
    eos_token: str


def render_gguf_template(
    template: GgufChatTemplate, messages: list[ChatMessage], thinking: bool | None, tools: list[dict] | None = None
) -> RenderedPrompt:
    """The GGUF's Jinja chat template, sandboxed (``tools`` only for a template that takes them).

    A template that raises for this conversation (``raise_exception``, bad Jinja) is the
    request's 400 invalid_request; one the sandbox refuses is the model's fault (502).
    """
    variables = {"bos_token": template.bos_token, "eos_token": template.eos_token}
    if thinking is not None:
        variables["enable_thinking"] = thinking
    if tools:
        variables["tools"] = tools
    try:
        text = render_chat_template(template.template, [_template_message(m) for m in messages], **variables)
    except UnsafeTemplate as exc:
        raise BackendError(str(exc)) from exc
    except TemplateRenderError as exc:
        raise InvalidRequest(f"the model's chat template rejected this conversation: {exc}", param="input") from exc
    return RenderedPrompt(((text, True),))


def _template_message(message: ChatMessage) -> dict:
    """A message as chat templates read it: OpenAI's shape, a call's arguments as an object."""
    rendered: dict = {"role": message.role, "content": message.content}
    if message.tool_calls:
        rendered["tool_calls"] = [
            {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": _arguments(call)}}
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    return rendered


def _arguments(call: dict) -> dict:
    try:
        arguments = json.loads(call.get("arguments") or "{}")
    except ValueError:
        raise InvalidRequest(f"the arguments of tool call {call.get('id')!r} are not JSON", param="messages") from None
    return arguments if isinstance(arguments, dict) else {"value": arguments}


# ---- tools as text (formats and templates that do not take tools) -------------------------

HERMES_TOOLS_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def takes_tools(prompt_format: str, gguf_template: GgufChatTemplate | None) -> bool:
    """Whether the format renders ``tools`` itself (a GGUF template that names them)."""
    return prompt_format == GGUF_TEMPLATE and gguf_template is not None and (
        detect_format(gguf_template.template) is not None
    )


def tool_call_format(prompt_format: str, gguf_template: GgufChatTemplate | None) -> str:
    """The format the model answers tool calls in: its template's, else ``hermes`` (tools as text)."""
    if takes_tools(prompt_format, gguf_template):
        return detect_format(gguf_template.template)
    return "hermes"


def tools_as_text(messages: list[ChatMessage], tools: list[dict] | None) -> list[ChatMessage]:
    """The conversation for a format without tools: the tools in the system message, earlier
    calls as ``<tool_call>`` blocks of the assistant's text, results as one user turn of
    ``<tool_response>`` blocks per run of tool messages."""
    described = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools or ())
    system, turns = _split_system(messages)
    out: list[ChatMessage] = []
    if tools:
        prompt = HERMES_TOOLS_PROMPT.format(tools=described)
        out.append(ChatMessage("system", f"{system}\n\n{prompt}" if system else prompt))
    elif system is not None:
        out.append(ChatMessage("system", system))
    for message in turns:
        if message.role == "tool":
            block = f"<tool_response>\n{message.content}\n</tool_response>"
            if out and out[-1].role == "user" and out[-1].content.startswith("<tool_response>"):
                out[-1] = replace(out[-1], content=f"{out[-1].content}\n{block}")
            else:
                out.append(ChatMessage("user", block))
        elif message.tool_calls:
            calls = "\n".join(
                "<tool_call>\n" + json.dumps({"name": call["name"], "arguments": _arguments(call)}, ensure_ascii=False)
                + "\n</tool_call>"
                for call in message.tool_calls
            )
            text = f"{message.content}\n{calls}" if message.content else calls
            out.append(ChatMessage("assistant", text))
        else:
            out.append(message)
    return out


# ---- dispatch ----------------------------------------------------------------------------

FORMATS = (GENERIC, MISTRAL, QWEN3, GEMMA4, TRANSLATEGEMMA, GGUF_TEMPLATE)


def render_prompt(
    prompt_format: str,
    messages: list[ChatMessage],
    *,
    thinking: bool | None = None,
    extra: dict | None = None,
    gguf_template: GgufChatTemplate | None = None,
    tools: list[dict] | None = None,
) -> RenderedPrompt:
    """Render ``messages`` in ``prompt_format``; ``thinking`` None keeps the family's default;
    ``tools`` (chat completions' tool objects) are offered to the model (see the module's doc)."""
    has_tool_turns = any(m.role == "tool" or m.tool_calls for m in messages)
    if takes_tools(prompt_format, gguf_template):
        return render_gguf_template(gguf_template, messages, thinking, tools)
    if tools or has_tool_turns:
        messages = tools_as_text(messages, tools)
    if prompt_format == GENERIC:
        return render_generic(messages)
    if prompt_format == MISTRAL:
        return render_mistral(messages)
    if prompt_format == QWEN3:
        return render_qwen3(messages, thinking)
    if prompt_format == GEMMA4:
        return render_gemma4(messages, thinking)
    if prompt_format == TRANSLATEGEMMA:
        return render_translategemma(messages, extra or {})
    if prompt_format == GGUF_TEMPLATE:
        if gguf_template is None:
            raise ValueError("gguf_template needs the template read from the GGUF file")
        return render_gguf_template(gguf_template, messages, thinking)
    raise ValueError(f"unknown prompt format {prompt_format!r}")


def resolve_thinking(requested: str, configured: bool | None) -> bool | None:
    """Request-level thinking over the model's ``enable_thinking`` (None: the family default)."""
    if requested == "enabled":
        return True
    if requested == "disabled":
        return False
    return configured
