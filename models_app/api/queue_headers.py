"""The headers that say how a request queues for its model (docs/scheduling.md), read once per
request with its key (``KeyRing.caller``), before its body is read:

- ``X-LLMPool-Queue-Timeout: <seconds>``: how long the request may wait before it starts (its
  model's load and queue); a decimal number above 0 and at most
  ``MAX_QUEUE_TIMEOUT_SECONDS`` (``2``, ``0.5``), else 400 invalid_queue_timeout.  Without it, the
  model's ``queue_timeout_seconds`` applies.
- the header ``service.priority_header`` names (none by default): the request's class, one of
  ``PRIORITY_CLASSES`` (400 invalid_priority otherwise), at most its API key's class (403
  priority_not_allowed above it: a batch key cannot ask for interactive).
"""
from __future__ import annotations

import re

from runtime.errors import InvalidPriority, InvalidQueueTimeout, PriorityNotAllowed
from runtime.queue_terms import MAX_QUEUE_TIMEOUT_SECONDS, PRIORITY_CLASSES, RANKS

QUEUE_TIMEOUT_HEADER = "x-llmpool-queue-timeout"
# Plain decimal seconds: no sign, exponent, "inf", "nan" or digit separators, which float() takes.
_SECONDS = re.compile(r"^[0-9]{1,6}(\.[0-9]{1,6})?$")


def queue_timeout(value: str | None) -> float | None:
    """The queue timeout header's seconds, or None without the header."""
    if value is None:
        return None
    text = value.strip()
    seconds = float(text) if _SECONDS.match(text) else None
    if seconds is None or not 0 < seconds <= MAX_QUEUE_TIMEOUT_SECONDS:
        raise InvalidQueueTimeout(
            f"{QUEUE_TIMEOUT_HEADER} must be a number of seconds above 0 and at most {MAX_QUEUE_TIMEOUT_SECONDS}, "
            f"not {value[:40]!r}",
            param=QUEUE_TIMEOUT_HEADER,
        )
    return seconds


def priority(value: str | None, header: str, *, own: str, ceiling: str) -> str:
    """The request's class: ``own`` (its key's, or the default class) without the header, else the
    header's class when it is not above ``ceiling``."""
    if value is None:
        return own
    asked = value.strip().lower()
    if asked not in RANKS:
        raise InvalidPriority(f"{header} must be one of {', '.join(PRIORITY_CLASSES)}, not {value[:40]!r}",
                              param=header)
    if RANKS[asked] < RANKS[ceiling]:
        raise PriorityNotAllowed(f"this API key's requests are at most of the {ceiling!r} class, not {asked!r}",
                                 param=header)
    return asked
