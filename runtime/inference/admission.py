"""What a request must satisfy before it is queued, and what it is charged when it is.

``engine_request`` is a generate payload as the model's engine runs it: the service's decoding
defaults and the client's reasoning effort applied, then checked.  ``check_request`` refuses
(400/403) what the model cannot take, from its capabilities (the sampling options included: a
seed, penalties or logprobs the engine does not honour are 400 invalid_request naming the field),
and decides which kind the engine gets: a ``ForwardedRequest`` where it forwards the client's body,
else the typed request; ``with_reasoning_effort`` turns a client's
reasoning effort into the model's thinking mode; ``estimate_prompt_tokens`` is the prompt size
the fair-share scheduler charges at dispatch, corrected to the engine's count when it ends.
"""
from __future__ import annotations

import dataclasses

from runtime.backends.base import REASONING_EFFORT_THINKING, SAMPLING_OPTIONS
from runtime.pool.catalog import CatalogEntry
from runtime.errors import (
    FileInputUnsupported,
    error_from_dict,
    InvalidRequest,
    ModalityUnsupported,
    MultiTurnUnsupported,
    RawPromptUnsupported,
    ResponseFormatUnsupported,
    ThinkingUnsupported,
    ToolsUnsupported,
)
from runtime.inputs.request import (
    THINKING_DEFAULT,
    DecodingSettings,
    ForwardedRequest,
    GenerationRequest,
    InferenceRequest,
    request_from_wire,
    typed_request,
    with_typed,
)
from runtime.inference.tool_calls import choice_kind

PART_MODALITY = {"input_image": "image", "input_audio": "audio"}


def estimate_prompt_tokens(request: GenerationRequest) -> int:
    """A tokenizer-free prompt size (about four characters a token) for fair-share charging:
    the instructions, the messages' text parts and a raw prompt."""
    chars = len(request.instructions or "") + len(request.prompt or "") + sum(
        len(part.get("text", "")) for message in request.messages for part in message["content"]
    )
    chars += sum(len(call.get("arguments", "")) for message in request.messages for call in message.get("tool_calls") or ())
    chars += sum(len(str(tool)) for tool in request.tools or ())
    return chars // 4 + 1


def engine_request(entry: CatalogEntry, payload: dict, decoding: DecodingSettings,
                   allow_remote: bool) -> InferenceRequest:
    """The request of a generate payload as ``entry``'s engine runs it (``check_request``), its
    typed fields resolved (``decoding``) and the client's reasoning effort applied."""
    request = request_from_wire(payload)
    typed = with_reasoning_effort(entry, typed_request(request).resolved(decoding))
    return check_request(entry, with_typed(request, typed), allow_remote)


def check_request(entry: CatalogEntry, request: InferenceRequest, allow_remote: bool) -> InferenceRequest:
    """Reject what the model cannot take (400/403) before it is queued; answer the kind its engine
    runs.  An engine that forwards gets a forwarded request as it is (its upstream judges the
    sampling options, the tools and the conversation); any other runs the typed request, and a
    forwarded request's first typed refusal is then its 400."""
    spec, definition = entry.spec, entry.definition
    typed = typed_request(request)
    entry.refuse_remote(allow_remote)
    if not spec.generates(definition):
        raise InvalidRequest(
            f"model {entry.name} does not generate text (backend {definition.backend}); it answers "
            "POST /v1/audio/transcriptions and /v1/audio/translations", param="model",
        )
    capabilities = spec.capabilities(definition)
    raw_prompt = typed.prompt is not None
    if raw_prompt and not capabilities["raw_prompt"]:
        raise RawPromptUnsupported(
            f"model {entry.name} does not take a raw text prompt (backend {definition.backend}); "
            "use /v1/chat/completions or /v1/responses",
            param="prompt",
        )
    match request:
        case ForwardedRequest() if spec.forwards_requests(definition):
            runs, forwards = request, True
        case ForwardedRequest(typed_refusals=[refusal, *_]):
            raise error_from_dict(refusal)
        case _:
            runs, forwards = typed, False
    if not forwards:
        _check_sampling_options(entry, typed, capabilities["sampling_options"])
    for message in typed.messages:
        for part in message["content"]:
            kind = part.get("type")
            if kind == "input_file" and not capabilities["file_inputs"]:
                raise FileInputUnsupported(f"model {entry.name} does not accept file inputs", param="input")
            modality = PART_MODALITY.get(kind)
            if modality and modality not in capabilities["modalities"]:
                raise ModalityUnsupported(
                    f"model {entry.name} does not accept {modality} input "
                    f"(modalities: {', '.join(capabilities['modalities'])})",
                    param="input",
                )
    # A forwarding engine's upstream judges the tools and the conversation; a raw prompt has none.
    if not forwards and not raw_prompt:
        _check_tools(entry, typed, capabilities)
        turns = [m for m in typed.messages if m["role"] in ("user", "assistant")]
        if len(turns) > 1 and not capabilities["multi_turn"]:
            raise MultiTurnUnsupported(f"model {entry.name} accepts a single user turn only", param="input")
        last = [m for m in typed.messages if m["role"] in ("user", "assistant", "tool")]
        if not turns or last[-1]["role"] not in ("user", "tool"):
            raise InvalidRequest("the input must end with a user message or a tool result", param="input")
    thinking = typed.thinking or THINKING_DEFAULT
    if thinking not in capabilities["thinking_modes"]:
        raise ThinkingUnsupported(
            f"model {entry.name} does not accept thinking={thinking!r} "
            f"(accepted: {', '.join(capabilities['thinking_modes'])})",
            param="thinking",
        )
    response_format = typed.response_format
    if response_format and response_format.get("type") != "text":
        kind = response_format.get("type")
        if kind not in capabilities["response_formats"] or typed.stream:
            raise ResponseFormatUnsupported(
                f"model {entry.name} does not accept response_format {kind!r}"
                + (" with stream" if typed.stream else ""),
                param="response_format",
            )
    return runs


def _check_tools(entry: CatalogEntry, request: GenerationRequest, capabilities: dict) -> None:
    """Tools (with a tool_choice other than "none"), tool calls and tool results in the
    conversation need ``capabilities.tools``; the tool_choice's kind must be one it honours."""
    for index, message in enumerate(request.messages):
        if (message["role"] == "tool" or message.get("tool_calls")) and not capabilities["tools"]:
            raise ToolsUnsupported(
                f"model {entry.name} (backend {entry.definition.backend}) does not take tool calls or tool "
                f"results in its conversation (capabilities.tools is false)",
                param=f"messages[{index}]",
            )
    kind = choice_kind(request.tool_choice)
    if not request.tools or kind == "none":
        return
    if not capabilities["tools"]:
        raise ToolsUnsupported(
            f"model {entry.name} (backend {entry.definition.backend}) does not take tools; leave them out or "
            "send tool_choice \"none\"",
            param="tools",
        )
    if kind not in capabilities["tool_choice"]:
        raise ToolsUnsupported(
            f"model {entry.name} does not honour tool_choice {kind!r} "
            f"(it honours: {', '.join(capabilities['tool_choice'])})",
            param="tool_choice",
        )


def _check_sampling_options(entry: CatalogEntry, request: GenerationRequest, honoured: list[str]) -> None:
    for option in SAMPLING_OPTIONS:  # each is the request field of its name
        if getattr(request, option) is not None and option not in honoured:
            raise InvalidRequest(
                f"model {entry.name} (backend {entry.definition.backend}) does not honour {option}; leave it out "
                f"(it honours: {', '.join(honoured) or 'none of ' + ', '.join(SAMPLING_OPTIONS)})",
                param=option,
            )


def with_reasoning_effort(entry: CatalogEntry, request: GenerationRequest) -> GenerationRequest:
    """``request`` with its ``reasoning_effort`` as ``thinking``: none and minimal mean
    "disabled", low to max "enabled", where the model's thinking modes have that mode; a model
    without it (one with only "default") ignores the effort.  A client's own ``thinking`` wins
    (the parser then leaves the effort out)."""
    effort = request.reasoning_effort
    if effort is None or request.thinking not in (None, THINKING_DEFAULT):
        return request
    mode = REASONING_EFFORT_THINKING.get(effort)
    if mode is None or mode not in entry.spec.thinking_modes(entry.definition):
        return request
    return dataclasses.replace(request, thinking=mode)
