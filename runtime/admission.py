"""What a request must satisfy before it is queued, and what it is charged when it is.

``check_request`` refuses (400/403) what the model cannot take, from its
capabilities; ``estimate_prompt_tokens`` is the prompt size the fair-share
scheduler charges at dispatch, corrected to the engine's count when it ends.
"""
from __future__ import annotations

from runtime.catalog import CatalogEntry
from runtime.errors import (
    FileInputUnsupported,
    error_from_dict,
    InvalidRequest,
    ModalityUnsupported,
    MultiTurnUnsupported,
    RemoteExecutionDisallowed,
    ResponseFormatUnsupported,
    ThinkingUnsupported,
)
from runtime.request import THINKING_DEFAULT, GenerationRequest

PART_MODALITY = {"input_image": "image", "input_audio": "audio"}


def estimate_prompt_tokens(request: GenerationRequest) -> int:
    """A tokenizer-free prompt size (about four characters a token) for fair-share charging."""
    chars = len(request.instructions or "") + sum(
        len(part.get("text", "")) for message in request.messages for part in message["content"]
    )
    return chars // 4 + 1


def check_request(entry: CatalogEntry, request: GenerationRequest, allow_remote: bool) -> None:
    """Reject what the model cannot take (400/403) before it is queued."""
    spec, definition = entry.spec, entry.definition
    if spec.is_remote(definition) and not allow_remote:
        raise RemoteExecutionDisallowed(
            f"model {entry.name} runs on a remote service and service.allow_remote_execution is false"
        )
    forwards = spec.forwards_requests(definition) and request.passthrough is not None
    if request.refused and not forwards:
        raise error_from_dict(request.refused[0])
    capabilities = spec.capabilities(definition)
    for message in request.messages:
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
    if not forwards:  # a forwarding engine's upstream judges the conversation (tool results end it, say)
        turns = [m for m in request.messages if m["role"] in ("user", "assistant")]
        if len(turns) > 1 and not capabilities["multi_turn"]:
            raise MultiTurnUnsupported(f"model {entry.name} accepts a single user turn only", param="input")
        if not turns or turns[-1]["role"] != "user":
            raise InvalidRequest("the input must end with a user message", param="input")
    thinking = request.thinking or THINKING_DEFAULT
    if thinking not in capabilities["thinking_modes"]:
        raise ThinkingUnsupported(
            f"model {entry.name} does not accept thinking={thinking!r} "
            f"(accepted: {', '.join(capabilities['thinking_modes'])})",
            param="thinking",
        )
    response_format = request.response_format
    if response_format and response_format.get("type") != "text":
        kind = response_format.get("type")
        if kind not in capabilities["response_formats"] or request.stream:
            raise ResponseFormatUnsupported(
                f"model {entry.name} does not accept response_format {kind!r}"
                + (" with stream" if request.stream else ""),
                param="response_format",
            )
