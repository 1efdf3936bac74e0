"""The embedded default's counters: every key's windows in this process's memory.

One API process serves the embedded shape, so its memory is the whole truth of the sliding
windows and of the requests in flight.  A key's budget counter is seeded from the database's
usage rows (``seed_budget``) the first time the key is admitted in a budget period, so a budget
spent before a restart stays spent; what this process charges after that is added here.
Every method is synchronous and takes the clock as arguments (``now``: monotonic seconds for the
windows, ``wall``: epoch seconds for the budget's calendar period), so the tests drive it exactly.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from models_app.quotas.policy import (
    BUDGET_EXHAUSTED,
    CONCURRENCY_LIMITED,
    CONCURRENCY_RETRY_SECONDS,
    RATE_LIMITED,
    TOKEN_RATE_LIMITED,
    WINDOW_SECONDS,
    BudgetPeriod,
    KeyLimits,
    Verdict,
    Window,
)


@dataclass
class _KeyCounters:
    admitted: deque[float] = field(default_factory=deque)  # admission times within the window
    charged: deque[tuple[float, int]] = field(default_factory=deque)  # (answer time, tokens) within it
    charged_sum: int = 0
    in_flight: int = 0
    budget_period: str | None = None  # the period ``budget_used`` counts, None: not seeded
    budget_used: int = 0

    def expire(self, now: float) -> None:
        edge = now - WINDOW_SECONDS
        while self.admitted and self.admitted[0] <= edge:
            self.admitted.popleft()
        while self.charged and self.charged[0][0] <= edge:
            self.charged_sum -= self.charged.popleft()[1]


class MemoryStore:
    def __init__(self):
        self._keys: dict[str, _KeyCounters] = {}

    def _counters(self, key: str) -> _KeyCounters:
        counters = self._keys.get(key)
        if counters is None:
            counters = self._keys[key] = _KeyCounters()
        return counters

    def budget_seeded(self, key: str, period: BudgetPeriod) -> bool:
        return self._counters(key).budget_period == period.name

    def seed_budget(self, key: str, period: BudgetPeriod, used: int) -> None:
        """The tokens ``key`` used in ``period`` before this process counted them (its usage rows)."""
        counters = self._counters(key)
        counters.budget_period, counters.budget_used = period.name, used

    def admit(self, key: str, limits: KeyLimits, now: float, period: BudgetPeriod | None) -> Verdict:
        """Admit one request of ``key`` or say which limit it is over; an admitted request counts
        in the requests window and, under a max_concurrent, holds a concurrency slot until ``release``.  ``period``: the
        budget period now (None without a budget), seeded first."""
        counters = self._counters(key)
        counters.expire(now)
        refused, wait = None, 0.0
        if period is not None and counters.budget_used >= limits.token_budget:
            refused, wait = BUDGET_EXHAUSTED, period.seconds_left
        elif limits.requests_per_minute is not None and len(counters.admitted) >= limits.requests_per_minute:
            refused = RATE_LIMITED
            wait = counters.admitted[len(counters.admitted) - limits.requests_per_minute] + WINDOW_SECONDS - now
        elif limits.tokens_per_minute is not None and counters.charged_sum >= limits.tokens_per_minute:
            refused, wait = TOKEN_RATE_LIMITED, self._tokens_wait(counters, limits.tokens_per_minute, now)
        elif limits.max_concurrent is not None and counters.in_flight >= limits.max_concurrent:
            refused, wait = CONCURRENCY_LIMITED, CONCURRENCY_RETRY_SECONDS
        if refused is None:
            counters.admitted.append(now)
            counters.in_flight += limits.max_concurrent is not None
        return Verdict(refused, wait, self._requests_window(counters, limits, now),
                       self._tokens_window(counters, limits, now))

    def charge(self, key: str, limits: KeyLimits, tokens: int, now: float, period: BudgetPeriod | None) -> None:
        """Count an answer's ``tokens`` (prompt and completion) for ``key`` at ``now``."""
        counters = self._counters(key)
        if limits.tokens_per_minute is not None:
            counters.charged.append((now, tokens))
            counters.charged_sum += tokens
        if period is not None and counters.budget_period == period.name:
            counters.budget_used += tokens

    def release(self, key: str) -> None:
        """The end of an admitted request: its concurrency slot is free."""
        counters = self._counters(key)
        counters.in_flight = max(0, counters.in_flight - 1)

    @staticmethod
    def _tokens_wait(counters: _KeyCounters, limit: int, now: float) -> float:
        """Seconds until enough charged tokens leave the window to bring it under ``limit``."""
        over = counters.charged_sum - limit
        for at, tokens in counters.charged:
            over -= tokens
            if over < 0:
                return at + WINDOW_SECONDS - now
        return 0.0

    @staticmethod
    def _requests_window(counters: _KeyCounters, limits: KeyLimits, now: float) -> Window | None:
        if limits.requests_per_minute is None:
            return None
        reset = counters.admitted[0] + WINDOW_SECONDS - now if counters.admitted else 0.0
        return Window(limits.requests_per_minute, max(0, limits.requests_per_minute - len(counters.admitted)), reset)

    @staticmethod
    def _tokens_window(counters: _KeyCounters, limits: KeyLimits, now: float) -> Window | None:
        if limits.tokens_per_minute is None:
            return None
        reset = counters.charged[0][0] + WINDOW_SECONDS - now if counters.charged else 0.0
        return Window(limits.tokens_per_minute, max(0, limits.tokens_per_minute - counters.charged_sum), reset)
