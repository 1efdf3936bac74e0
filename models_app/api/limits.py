"""The limits every request body and fairness key meets at the edge (docs/api.md, "Limits").

A body is parsed once (``parse_json``): strict JSON (no NaN or Infinity), UTF-8 (or the UTF-16/32
that JSON allows), nested at most ``MAX_JSON_DEPTH`` arrays or objects deep, every integer in it,
wherever it sits (a tool's parameters schema too), within a signed 64-bit integer, and every
string and key Unicode text (no lone UTF-16 surrogate, which JSON's ``\\ud800`` escape can write):
the channel to the runtime (msgpack) carries nothing else.  The declared integer fields of each
body have tighter bounds in their schemas.  A fairness key (a fairness header's value or the
body's ``user``) is at most ``MAX_FAIRNESS_KEY_LENGTH`` characters: the scheduler keeps one
record per key.

A generation body also meets per-request bounds on what costs work for each of its items
(``check_generation_bounds``): the messages (or Responses input items), their content parts and
tool calls, the tools, and the stop sequences, which the runtime searches for in every piece of
text it produces.  The bounds are far above what clients send (OpenAI takes 4 stop sequences and
128 tools), and low enough that one request's parse, copy and stop search stay in milliseconds.
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Union

import orjson
from pydantic import Field
from rest_framework.parsers import JSONParser

from runtime.config import json_path
from runtime.errors import FairnessKeyTooLong, InvalidRequest, LLMPoolError

MAX_JSON_DEPTH = 64
MIN_INTEGER, MAX_INTEGER = -(2**63), 2**63 - 1
# Every declared integer field of a request body is at most this (and the schema says so).
MAX_FIELD_INTEGER = 2**31 - 1
MAX_FAIRNESS_KEY_LENGTH = 256
# Messages (chat) or input items (Responses); also their content parts and tool calls, in all.
MAX_MESSAGES = 10_000
MAX_TOOLS = 256
MAX_STOP_SEQUENCES = 16
MAX_STOP_LENGTH = 1_000  # characters
# Documents of one rerank request (POST /v1/rerank): each is a pass of the model over the query and
# the document, so the bound keeps one request's work within a request timeout (as Cohere's 1,000).
MAX_RERANK_DOCUMENTS = 1_000

# ``stop`` as chat completions and completions take it, bounds in its schema (and so in the OpenAPI
# document); ``check_generation_bounds`` refuses a body past them first, with a message naming them.
StopSequences = Union[
    Annotated[str, Field(max_length=MAX_STOP_LENGTH)],
    Annotated[list[Annotated[str, Field(max_length=MAX_STOP_LENGTH)]], Field(max_length=MAX_STOP_SEQUENCES)],
    None,
]

# llama.cpp's sampling knobs as the protocols that have them take them (chat, Anthropic's top_k,
# Ollama's options): top_k 0 keeps every token and repeat_penalty 1 is none, so either is no option
# (``sampling_knobs``); a repeat_penalty of 0 would divide by zero in llama.cpp.
TopK = Annotated[int | None, Field(ge=0, le=MAX_FIELD_INTEGER)]
RepeatPenalty = Annotated[float | None, Field(gt=0, le=10)]


def sampling_knobs(top_k: int | None, repeat_penalty: float | None) -> dict[str, Any]:
    """The typed request's ``top_k`` and ``repeat_penalty``: None where the value changes nothing."""
    return {"top_k": top_k or None, "repeat_penalty": None if repeat_penalty in (None, 1.0) else repeat_penalty}


class BodyRefused(InvalidRequest):
    """A body that is not JSON within the limits (400 invalid_request unless an endpoint says otherwise)."""


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


class _NotExact(Exception):
    """orjson read an integer past 64 bits as a float: the standard library parses that body."""


def parse_json(body: bytes | str) -> Any:
    """The body as JSON within the limits; raises ``BodyRefused`` naming the problem.

    orjson parses it first (a tenth of the standard library's time).  A body orjson refuses (not
    UTF-8, NaN, a lone surrogate, a number too large for a double...) goes to the standard
    library's parser, and so does one in which orjson read a float of 2**63 or more: an integer
    outside orjson's range (-2**63 to 2**64 - 1) comes back as such a float, and the standard
    library's exact integer is then refused by name.  So what is accepted, and every refusal's
    message, is the standard library's, except a lone surrogate, which the standard library
    reads (from an escape, or from surrogatepass bytes) and which is refused naming its field.
    (Searching the body for 19 digits in a row would find those integers too, at about 1 ms for
    a 100 KiB conversation, ten times orjson's parse.)"""
    raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    try:
        data = orjson.loads(raw)
        check_json(data, orjson_read=True)
        return data
    except (orjson.JSONDecodeError, _NotExact):
        pass
    try:
        data = json.loads(body, parse_constant=_refuse_constant)
    except RecursionError:
        raise BodyRefused(f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise BodyRefused(f"JSON parse error - {exc}") from None
    check_json(data)
    _refuse_lone_surrogates(data)
    return data


def _refuse_lone_surrogates(data: Any) -> None:
    """Raises ``BodyRefused`` naming the first string or key that holds a lone UTF-16 surrogate.

    Only bodies orjson refused get here (orjson refuses every lone surrogate), so ordinary bodies
    never pay for this walk."""
    found = _surrogate_at(data, ())
    if found is None:
        return
    loc, key = found
    path = json_path(loc)
    what = path if key is None else f"{path}: the key {ascii(key)[:40]}"
    raise BodyRefused(
        f"{what} holds a lone UTF-16 surrogate, which is not text (a \\ud800-\\udfff escape must be half "
        "of a pair)",
        param=None if path == "$" else path.removeprefix("$."),
    )


def _surrogate_at(value: Any, loc: tuple) -> tuple[tuple, str | None] | None:
    """Where the first lone surrogate is: the location of its string, or of the object whose key
    holds it (and that key)."""
    kind = type(value)
    if kind is str:
        return None if _is_text(value) else (loc, None)
    if kind is dict:
        for key, item in value.items():
            if not _is_text(key):
                return loc, key
            found = _surrogate_at(item, (*loc, key))
            if found is not None:
                return found
    elif kind is list:
        for index, item in enumerate(value):
            found = _surrogate_at(item, (*loc, index))
            if found is not None:
                return found
    return None


def _is_text(string: str) -> bool:
    if string.isascii():
        return True
    try:
        string.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_json(data: Any, *, orjson_read: bool = False) -> None:
    """Raises ``BodyRefused`` for nesting deeper than ``MAX_JSON_DEPTH`` or an integer outside 64 bits
    (and ``_NotExact``, with ``orjson_read``, for a float orjson may have made of such an integer).

    ``data`` is a JSON parser's output (exact dicts, lists, strings, numbers), so the walk tests
    types by identity and passes over strings first, the most of a conversation's values."""
    if type(data) is dict or type(data) is list:
        _check_container(data, 0, orjson_read)
    else:
        _check_scalar(data, orjson_read)


def _check_container(container: dict | list, depth: int, orjson_read: bool) -> None:
    if depth >= MAX_JSON_DEPTH:
        raise BodyRefused(f"the body is nested deeper than {MAX_JSON_DEPTH} levels")
    for value in container.values() if type(container) is dict else container:
        kind = type(value)
        if kind is str:
            continue
        if kind is dict or kind is list:
            _check_container(value, depth + 1, orjson_read)
        else:
            _check_scalar(value, orjson_read)


def _check_scalar(value: Any, orjson_read: bool) -> None:
    kind = type(value)
    if kind is int and not MIN_INTEGER <= value <= MAX_INTEGER:
        raise BodyRefused(f"the integer {str(value)[:24]}... is outside the signed 64-bit range")
    if kind is float and orjson_read and not -_TWO_TO_63 < value < _TWO_TO_63:
        raise _NotExact


_TWO_TO_63 = float(2**63)


def check_generation_bounds(data: dict, *, items: str | None) -> None:
    """Raises ``InvalidRequest`` naming the first per-request bound the body passes: ``items`` (the
    conversation's field: ``messages`` or ``input``; None for a raw prompt), the content parts and
    tool calls of its messages, ``tools`` and ``stop``.  It reads the parsed body before its schema
    is validated, so a list far past a bound costs no validation; what is not of the schema's
    shape is left to the schema."""
    conversation = data.get(items) if items is not None else None
    if type(conversation) is list:
        _check_count(conversation, MAX_MESSAGES, items, "messages" if items == "messages" else "input items")
        parts = sum(_part_count(message) for message in conversation)
        if parts > MAX_MESSAGES:
            raise InvalidRequest(
                f"{items}: {parts} content parts and tool calls in all; at most {MAX_MESSAGES} are accepted",
                param=items,
            )
    _check_count(data.get("tools"), MAX_TOOLS, "tools", "tools")
    stop = data.get("stop")
    _check_count(stop, MAX_STOP_SEQUENCES, "stop", "stop sequences")
    for index, sequence in enumerate([stop] if type(stop) is str else stop if type(stop) is list else ()):
        if type(sequence) is str and len(sequence) > MAX_STOP_LENGTH:
            param = "stop" if type(stop) is str else f"stop[{index}]"
            raise InvalidRequest(
                f"{param} has {len(sequence)} characters; a stop sequence may have at most {MAX_STOP_LENGTH}",
                param=param,
            )


def _check_count(value: Any, limit: int, param: str, what: str) -> None:
    if type(value) is list and len(value) > limit:
        raise InvalidRequest(f"{param} holds {len(value)} {what}; at most {limit} are accepted", param=param)


def _part_count(message: Any) -> int:
    """A message's content parts and tool calls (a Responses function_call_output's output parts too)."""
    if type(message) is not dict:
        return 0
    return sum(len(message[key]) for key in ("content", "tool_calls", "output") if type(message.get(key)) is list)


def fairness_key(decided: str | None, user: str | None) -> str | None:
    """The request's fairness key: the edge's (a key's bucket or a fairness header), else ``user``."""
    if decided is not None:
        return decided
    check_fairness_key(user, param="user")
    return user


def check_fairness_key(value: str | None, *, param: str) -> None:
    if value is not None and len(value) > MAX_FAIRNESS_KEY_LENGTH:
        raise FairnessKeyTooLong(
            f"{param} is a fairness key and may be at most {MAX_FAIRNESS_KEY_LENGTH} characters "
            f"(this one has {len(value)})", param=param,
        )


def refused_as(exc: LLMPoolError, error: type[LLMPoolError]) -> LLMPoolError:
    """``exc`` (a BodyRefused) as the endpoint's own error class, same message."""
    return error(exc.message, param=exc.param)


class JSONBodyParser(JSONParser):
    """DRF's JSON parser with ``parse_json``'s limits (the machine API's only parser)."""

    def parse(self, stream, media_type=None, parser_context=None):
        return parse_json(stream.read() if stream is not None else b"")
