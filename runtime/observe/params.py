"""The query parameters of the admin reads (activity, model logs)."""
from __future__ import annotations

from typing import Any

from runtime.errors import InvalidRequest


def count_param(value: Any, *, upper: int, param: str) -> int:
    """``value`` as an integer from 1 to ``upper``; ``InvalidRequest`` naming ``param`` otherwise."""
    try:
        count = int(value)
    except (TypeError, ValueError):
        count = 0
    if not 1 <= count <= upper:
        raise InvalidRequest(f"{param} must be an integer from 1 to {upper}", param=param)
    return count
