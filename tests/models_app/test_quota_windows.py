"""The embedded store's windows (``models_app.quotas.memory_store``) driven by an exact clock: the
61st request of a 60 rpm key within any 60 s is refused and the one a window later is let in; a
key's tokens per minute count the answers' charged tokens; concurrent requests hold a slot until
released; a budget seeded from the usage rows refuses once spent, until its period ends; a refused
request counts nowhere; the headers say what is left."""
from __future__ import annotations

from datetime import date, datetime, timezone

import pytest

from models_app.quotas.memory_store import MemoryStore
from models_app.quotas.policy import BudgetPeriod, KeyLimits, duration_text, retry_after_header

KEY = "7"


def test_the_61st_request_within_a_minute_is_refused_and_one_a_window_later_is_let_in():
    store, limits = MemoryStore(), KeyLimits(requests_per_minute=60)
    for second in range(60):
        verdict = store.admit(KEY, limits, 1000.0 + second * 0.5, None)
        assert verdict.refused is None
        assert verdict.requests.remaining == 59 - second
    refused = store.admit(KEY, limits, 1059.9, None)
    assert refused.refused == "rate_limited"
    assert refused.retry_after == pytest.approx(0.1)  # the first request leaves the window at 1060.0
    assert retry_after_header(refused.retry_after) == 1
    assert refused.requests.remaining == 0
    assert store.admit(KEY, limits, 1060.0, None).refused is None  # the first one left: one more
    assert store.admit(KEY, limits, 1060.0, None).refused == "rate_limited"
    assert store.admit(KEY, limits, 1060.5, None).refused is None


def test_a_refused_request_counts_nowhere():
    store, limits = MemoryStore(), KeyLimits(requests_per_minute=2, max_concurrent=5)
    assert [store.admit(KEY, limits, 10.0, None).refused for _ in range(5)] == [None, None] + ["rate_limited"] * 3
    for _ in range(2):
        store.release(KEY)
    verdict = store.admit(KEY, limits, 70.0, None)
    assert verdict.refused is None and verdict.requests.remaining == 1


def test_tokens_per_minute_count_the_charged_answers():
    store, limits = MemoryStore(), KeyLimits(tokens_per_minute=150)
    assert store.admit(KEY, limits, 0.0, None).tokens.remaining == 150
    store.charge(KEY, limits, 100, 1.0, None)
    verdict = store.admit(KEY, limits, 2.0, None)
    assert verdict.refused is None and verdict.tokens.remaining == 50 and verdict.tokens.reset_seconds == 59.0
    store.charge(KEY, limits, 60, 3.0, None)  # 160 counted: past the limit
    refused = store.admit(KEY, limits, 4.0, None)
    assert refused.refused == "token_rate_limited" and refused.tokens.remaining == 0
    assert refused.retry_after == pytest.approx(57.0)  # the 100 leave at 61.0, leaving 60 < 150
    assert store.admit(KEY, limits, 61.0, None).tokens.remaining == 90


def test_concurrent_requests_hold_a_slot_until_released():
    store, limits = MemoryStore(), KeyLimits(max_concurrent=2)
    assert [store.admit(KEY, limits, 0.0, None).refused for _ in range(3)] == [None, None, "concurrency_limited"]
    store.release(KEY)
    assert store.admit(KEY, limits, 0.1, None).refused is None
    assert store.admit(KEY, limits, 0.1, None).refused == "concurrency_limited"


def test_a_budget_refuses_once_spent_until_its_period_ends():
    store, limits = MemoryStore(), KeyLimits(token_budget=1000, budget_period="day")
    wall = datetime(2026, 12, 5, 18, 0, tzinfo=timezone.utc).timestamp()
    period = BudgetPeriod.at("day", wall)
    assert not store.budget_seeded(KEY, period)
    store.seed_budget(KEY, period, 900)  # spent before a restart (the usage rows)
    assert store.admit(KEY, limits, 0.0, period).refused is None
    store.charge(KEY, limits, 100, 1.0, period)
    refused = store.admit(KEY, limits, 2.0, period)
    assert refused.refused == "budget_exhausted" and refused.retry_after == 6 * 3600
    tomorrow = BudgetPeriod.at("day", wall + 6 * 3600)
    assert not store.budget_seeded(KEY, tomorrow)
    store.seed_budget(KEY, tomorrow, 0)
    assert store.admit(KEY, limits, 3.0, tomorrow).refused is None


def test_budget_periods_are_utc_days_and_calendar_months():
    wall = datetime(2026, 2, 14, 12, 0, tzinfo=timezone.utc).timestamp()
    day, month = BudgetPeriod.at("day", wall), BudgetPeriod.at("month", wall)
    assert (day.name, day.first_day, day.last_day, day.seconds_left) == \
        ("d2026-02-14", date(2026, 2, 14), date(2026, 2, 14), 12 * 3600)
    assert (month.name, month.first_day, month.last_day) == ("m2026-02", date(2026, 2, 1), date(2026, 2, 28))
    assert month.seconds_left == (14 * 24 + 12) * 3600


def test_the_headers_say_what_is_left_of_each_window():
    store, limits = MemoryStore(), KeyLimits(requests_per_minute=10, tokens_per_minute=1000)
    store.admit(KEY, limits, 0.0, None)
    store.charge(KEY, limits, 250, 0.5, None)
    headers = store.admit(KEY, limits, 30.0, None).headers()
    assert headers == {
        "x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "8", "x-ratelimit-reset-requests": "30s",
        "x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "750",
        "x-ratelimit-reset-tokens": "31s",
    }
    assert store.admit("other", KeyLimits(max_concurrent=1), 0.0, None).headers() == {}
    assert [duration_text(s) for s in (0, 0.25, 12, 359.5)] == ["0s", "250ms", "12s", "6m0s"]
