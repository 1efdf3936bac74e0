"""The limits every request body and fairness key meets at the edge (docs/api.md, "Limits").

A body is parsed once (``parse_json``): strict JSON (no NaN or Infinity), UTF-8 (or the UTF-16/32
that JSON allows), nested at most ``MAX_JSON_DEPTH`` arrays or objects deep, and every integer
in it, wherever it sits (a tool's parameters schema too), within a signed 64-bit integer: the
channel to the runtime (msgpack) carries nothing larger.  The declared integer fields of each
body have tighter bounds in their schemas.  A fairness key (a fairness header's value or the
body's ``user``) is at most ``MAX_FAIRNESS_KEY_LENGTH`` characters: the scheduler keeps one
record per key.
"""
from __future__ import annotations

import json
from typing import Any

import orjson

from rest_framework.parsers import JSONParser

from runtime.errors import FairnessKeyTooLong, InvalidRequest, LLMPoolError

MAX_JSON_DEPTH = 64
MIN_INTEGER, MAX_INTEGER = -(2**63), 2**63 - 1
# Every declared integer field of a request body is at most this (and the schema says so).
MAX_FIELD_INTEGER = 2**31 - 1
MAX_FAIRNESS_KEY_LENGTH = 256


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
    message, is the standard library's.  (A search for 19 digits in a row did that before: it took
    about 1 ms for a 100 KiB conversation, ten times orjson's parse.)"""
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
    return data


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
