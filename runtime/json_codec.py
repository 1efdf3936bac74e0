"""JSON on the hot path: orjson where it gives the same answer, the standard library where not.

Every answer and every streamed chunk is encoded once per request or token (the edge's
``json_bytes``, the upstream client's bodies), and every upstream chunk decoded once
(``forwarding``, ``openai_chat``); orjson does both several times faster than ``json``.  Its output
is the same compact UTF-8 JSON as ``json``'s with ``separators=(",", ":")`` and ``ensure_ascii=False``.
Where orjson refuses what ``json`` takes (a dict key that is not a string, an integer beyond 64
bits; NaN or Infinity in a document), the standard library answers.
"""
from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def loads(data: bytes | str) -> Any:
    """The JSON document ``data``; a ``ValueError`` when it is not one (as ``json.loads``)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)  # NaN, Infinity and the like; anything else raises ValueError here
