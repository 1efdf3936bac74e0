"""What a key's limits are and what an admission decided: plain data and arithmetic, no I/O.

Both stores (``memory_store`` for the embedded default, ``redis_store`` for the split) answer an
admission with a ``Verdict``: the code of the first limit it is over (checked in the order
budget, requests per minute, tokens per minute, concurrent requests), how long until that limit
lets a request in, and the requests and tokens windows as the ``x-ratelimit-*`` headers show
them.  The windows are sliding: a request counts for the 60 s after its admission, a request's
tokens for the 60 s after its answer, so the 61st request of a 60 rpm key within any 60 s is
refused.  A budget is per UTC calendar day or month.
"""
from __future__ import annotations

import calendar
import math
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone

from runtime.key_terms import LIMIT_NAMES

WINDOW_SECONDS = 60.0

BUDGET_EXHAUSTED = "budget_exhausted"
RATE_LIMITED = "rate_limited"
TOKEN_RATE_LIMITED = "token_rate_limited"
CONCURRENCY_LIMITED = "concurrency_limited"

# How long a refused request over max_concurrent is told to wait: a slot frees when a request ends.
CONCURRENCY_RETRY_SECONDS = 1.0


@dataclass(frozen=True)
class KeyLimits:
    """A key's limits (None: no limit), as its row or its entry of settings.json declares them
    (``runtime.key_terms``)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None
    token_budget: int | None = None
    budget_period: str | None = None  # "day" or "month" when token_budget is set

    @classmethod
    def from_row(cls, row) -> KeyLimits | None:
        """The limits of a key row (a mapping, or a key of settings.json dumped), or None when it has
        none: its requests skip the stores."""
        limits = cls(**{name: row[name] for name in LIMIT_NAMES})
        return None if limits == _NONE else limits

    @property
    def charges_tokens(self) -> bool:
        """Whether a request's tokens are counted against a limit (its answer's usage is charged)."""
        return self.tokens_per_minute is not None or self.token_budget is not None


_NONE = KeyLimits()


@dataclass(frozen=True)
class Window:
    """One sliding window as the headers show it after an admission."""

    limit: int
    remaining: int  # never below 0
    reset_seconds: float  # until the oldest of what it counts leaves it (0 when it counts nothing)


@dataclass(frozen=True)
class Verdict:
    refused: str | None  # the code of the limit the request is over, None when admitted
    retry_after: float  # seconds until that limit lets a request in (0 when admitted)
    requests: Window | None  # None: the key has no requests_per_minute
    tokens: Window | None  # None: the key has no tokens_per_minute

    def headers(self) -> dict[str, str]:
        """The OpenAI-style ``x-ratelimit-*`` headers of the key's windows."""
        headers = {}
        for suffix, window in (("requests", self.requests), ("tokens", self.tokens)):
            if window is not None:
                headers[f"x-ratelimit-limit-{suffix}"] = str(window.limit)
                headers[f"x-ratelimit-remaining-{suffix}"] = str(window.remaining)
                headers[f"x-ratelimit-reset-{suffix}"] = duration_text(window.reset_seconds)
        return headers


def duration_text(seconds: float) -> str:
    """A duration as OpenAI's reset headers write it: ``"250ms"``, ``"12s"``, ``"6m0s"``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    minutes, rest = divmod(whole, 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


def retry_after_header(seconds: float) -> int:
    """Retry-After in whole seconds, at least 1, rounded up so a retry then is let in."""
    return max(1, math.ceil(seconds))


@dataclass(frozen=True)
class BudgetPeriod:
    """The UTC calendar day or month a budget counts in."""

    name: str  # "d2026-12-05" or "m2026-12": the counters' key
    first_day: date
    last_day: date
    seconds_left: float  # until it ends

    @classmethod
    def at(cls, period: str, wall: float) -> BudgetPeriod:
        """The ``period`` ("day" or "month") that the UTC wall-clock time ``wall`` is in."""
        moment = datetime.fromtimestamp(wall, timezone.utc)
        today = moment.date()
        if period == "day":
            first, last, name = today, today, f"d{today.isoformat()}"
        else:
            first = today.replace(day=1)
            last = today.replace(day=calendar.monthrange(today.year, today.month)[1])
            name = f"m{first.isoformat()[:7]}"
        end = datetime.combine(last + timedelta(days=1), datetime.min.time(), timezone.utc)
        return cls(name, first, last, (end - moment).total_seconds())
