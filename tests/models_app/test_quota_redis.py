"""The split's store (``models_app.quotas.redis_store``) against the test Redis: two stores (two API
processes) share one key's windows, so the 61st request of a 60 rpm key is refused whichever
asks; an answer's tokens count against tokens per minute and the budget; a concurrency slot held
by a process that stops renewing its lease (it died) is freed when the lease ends, and not before
while it renews."""
from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis

from models_app.quotas import redis_store
from models_app.quotas.policy import BudgetPeriod, KeyLimits
from models_app.transport import nodes
from tests.conftest import REDIS_URL

KEY = 7


@pytest.fixture(autouse=True)
def own_prefix(settings, monkeypatch):
    prefix = f"llmpooltest-{uuid.uuid4().hex[:10]}"
    settings.REDIS_URL = REDIS_URL
    monkeypatch.setattr(nodes, "prefix", lambda: prefix)
    yield
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{prefix}*"))
    if keys:
        client.delete(*keys)
    client.close()


async def test_two_processes_share_one_keys_requests_per_minute():
    first, second, limits = redis_store.RedisStore(), redis_store.RedisStore(), KeyLimits(requests_per_minute=60)
    for index in range(60):
        verdict = await (first, second)[index % 2].admit(KEY, limits, f"r{index}", None)
        assert (verdict.refused, verdict.requests.remaining) == (None, 59 - index)
    for store in (first, second):
        refused = await store.admit(KEY, limits, "r60", None)
        assert refused.refused == "rate_limited" and 55 < refused.retry_after <= 60
        assert refused.requests.remaining == 0


async def test_an_answers_tokens_count_against_tokens_per_minute_and_the_budget():
    store = redis_store.RedisStore()
    period = BudgetPeriod.at("day", time.time())
    per_minute = KeyLimits(tokens_per_minute=100)
    assert (await store.admit(KEY, per_minute, "a", None)).tokens.remaining == 100
    await store.finish(KEY, per_minute, 60, "a", None, release=False)
    assert (await store.admit(KEY, per_minute, "b", None)).tokens.remaining == 40
    await store.finish(KEY, per_minute, 40, "b", None, release=False)
    refused = await store.admit(KEY, per_minute, "c", None)
    assert refused.refused == "token_rate_limited" and refused.tokens.remaining == 0
    assert 55 < refused.retry_after <= 60  # until the first answer's 60 leave the window

    budget = KeyLimits(token_budget=50, budget_period="day")
    assert (await store.admit(KEY + 1, budget, "d", period)).refused is None
    await store.finish(KEY + 1, budget, 50, "d", period, release=False)
    refused = await store.admit(KEY + 1, budget, "e", period)
    assert refused.refused == "budget_exhausted"
    assert abs(refused.retry_after - BudgetPeriod.at("day", time.time()).seconds_left) < 5


async def test_a_slot_is_held_while_its_lease_is_renewed_and_freed_when_it_lapses(monkeypatch):
    monkeypatch.setattr(redis_store, "LEASE_SECONDS", 1)
    holder, other, limits = redis_store.RedisStore(), redis_store.RedisStore(), KeyLimits(max_concurrent=1)
    assert (await holder.admit(KEY, limits, "held", None)).refused is None
    assert (await other.admit(KEY, limits, "x", None)).refused == "concurrency_limited"
    await asyncio.sleep(0.6)
    await holder.renew_leases()  # the lease now ends 1 s from here
    await asyncio.sleep(0.6)
    assert (await other.admit(KEY, limits, "y", None)).refused == "concurrency_limited"
    await asyncio.sleep(0.6)  # the holder stopped renewing (its process died): the lease lapsed
    verdict = await other.admit(KEY, limits, "z", None)
    assert verdict.refused is None
    await other.finish(KEY, limits, 0, "z", None, release=True)
    assert (await holder.admit(KEY, limits, "again", None)).refused is None
