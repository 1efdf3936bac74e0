"""A key's limits at the edge: each request of a key is admitted here, before its body is read.

``admit(caller)`` answers a ``Grant`` for a request of a key, of the database or of settings.json
(None without keys configured); a key is counted under its ``quota_key`` (``api.keys``): a
database key's primary key, ``settings:<name>`` for a key of settings.json:

- a key with limits asks its store (``MemoryStore`` embedded, ``RedisStore`` in the split: one
  round trip) whether the request is over one; ``grant.refusal`` is then the 429 to answer
  (``rate_limited``, ``token_rate_limited``, ``concurrency_limited``, ``budget_exhausted``), its
  Retry-After the wait the store computed, and ``grant.headers`` the ``x-ratelimit-*`` headers
  that every answer to the request carries;
- ``count`` (called where the runtime's answer arrives: ``api.inference``) adds the engine's
  real prompt and completion tokens to the usage ledger (``quotas.usage``) that the database's
  usage rows are written from, and to the grant;
- ``grant.finish()``, once the answer is sent, charges those tokens against the key's tokens per
  minute and budget and frees its concurrency slot: in the split one more round trip, which the
  client does not wait for.

The grant of the request being served is ``CURRENT`` (set by the inference front for its own
request task), so the protocols' code counts without passing it along.
"""
from __future__ import annotations

import logging
import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async

from models_app import selectors
from models_app.quotas import usage
from models_app.quotas.memory_store import MemoryStore
from models_app.quotas.policy import (
    BUDGET_EXHAUSTED,
    CONCURRENCY_LIMITED,
    RATE_LIMITED,
    TOKEN_RATE_LIMITED,
    BudgetPeriod,
    KeyLimits,
    Verdict,
    retry_after_header,
)
from models_app.quotas.redis_store import SPLIT_STORE, RedisStore
from models_app.transport import nodes
from runtime.errors import (
    BudgetExhausted,
    ConcurrencyLimited,
    LLMPoolError,
    RateLimited,
    RuntimeUnavailable,
    TokenRateLimited,
)

logger = logging.getLogger("llmpool.api")

_ERRORS = {
    BUDGET_EXHAUSTED: (BudgetExhausted, "the API key's token budget for this {period} is spent"),
    RATE_LIMITED: (RateLimited, "the API key's requests per minute ({limit}) are used up"),
    TOKEN_RATE_LIMITED: (TokenRateLimited, "the API key's tokens per minute ({limit}) are used up"),
    CONCURRENCY_LIMITED: (ConcurrencyLimited, "the API key has {limit} requests in flight, its max_concurrent"),
}


class _EmbeddedStore:
    """The in-memory store, with the wall clock and the budget seeded from the usage rows."""

    def __init__(self):
        self.memory = MemoryStore()

    async def admit(self, key: int | str, limits: KeyLimits, request_id: str, period: BudgetPeriod | None) -> Verdict:
        name = str(key)
        if period is not None and not self.memory.budget_seeded(name, period):
            used = await sync_to_async(selectors.key_tokens_between)(key, period.first_day, period.last_day)
            if not self.memory.budget_seeded(name, period):  # a request beside this one may have seeded it
                unwritten = usage.LEDGER.pending_tokens(key, period.first_day, period.last_day)
                self.memory.seed_budget(name, period, used + unwritten)
        return self.memory.admit(name, limits, time.monotonic(), period)

    async def finish(self, key: int | str, limits: KeyLimits, tokens: int, request_id: str,
                     period: BudgetPeriod | None, release: bool) -> None:
        name = str(key)
        if tokens:
            self.memory.charge(name, limits, tokens, time.monotonic(), period)
        if release:
            self.memory.release(name)


EMBEDDED = _EmbeddedStore()


def store() -> _EmbeddedStore | RedisStore:
    return SPLIT_STORE if nodes.is_split() else EMBEDDED


def _period(limits: KeyLimits | None) -> BudgetPeriod | None:
    if limits is None or limits.token_budget is None:
        return None
    return BudgetPeriod.at(limits.budget_period, time.time())


@dataclass
class Grant:
    """One admitted (or refused) request of a key."""

    key: int | str  # the key's quota key
    limits: KeyLimits | None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    headers: dict[str, str] = field(default_factory=dict)
    refusal: LLMPoolError | None = None
    holds_slot: bool = False
    tokens: int = 0  # what its answer used, counted at ``finish``

    def count(self, model: str, input_tokens: int, output_tokens: int) -> None:
        """An answer's tokens: in the usage ledger at once, against the key's limits at ``finish``."""
        usage.LEDGER.record(self.key, model, input_tokens, output_tokens)
        self.tokens += input_tokens + output_tokens

    async def finish(self) -> None:
        """The end of the request, once its answer is sent: its tokens count against the key's
        tokens per minute and budget, and its concurrency slot is free."""
        tokens = self.tokens if self.limits is not None and self.limits.charges_tokens else 0
        release, self.holds_slot = self.holds_slot, False
        if not tokens and not release:
            return
        try:
            await store().finish(self.key, self.limits, tokens, self.request_id, _period(self.limits), release)
        except Exception as exc:  # the answer is given; a slot not freed is freed when its lease ends
            logger.warning("the end of a request of key_%s could not be counted: %s", self.key, exc)


CURRENT: ContextVar[Grant | None] = ContextVar("llmpool_key_grant", default=None)


async def admit(key: int | str | None, limits: KeyLimits | None) -> Grant | None:
    """The grant of a request of the key whose quota key is ``key`` (None: no key)."""
    if key is None:
        return None
    grant = Grant(key, limits)
    if limits is None:
        return grant
    period = _period(limits)
    try:
        verdict = await store().admit(key, limits, grant.request_id, period)
    except Exception as exc:
        raise RuntimeUnavailable(f"the API key's limits could not be checked: {exc}") from exc
    grant.headers = verdict.headers()
    if verdict.refused is None:
        grant.holds_slot = limits.max_concurrent is not None
        return grant
    error, message = _ERRORS[verdict.refused]
    limit = {RATE_LIMITED: limits.requests_per_minute, TOKEN_RATE_LIMITED: limits.tokens_per_minute,
             CONCURRENCY_LIMITED: limits.max_concurrent}.get(verdict.refused)
    grant.refusal = error(message.format(period=limits.budget_period, limit=limit))
    grant.refusal.retry_after = retry_after_header(verdict.retry_after)
    return grant


def count(model: str, used: dict) -> None:
    """Count the runtime's usage of ``model`` for the request being served: ``input_tokens`` and
    ``output_tokens`` (a generation, what a stream closed early used, a transcription's audio and
    transcript tokens) or ``prompt_tokens`` (embeddings, rerank)."""
    grant = CURRENT.get()
    if grant is None:
        return
    if "prompt_tokens" in used:
        grant.count(model, int(used["prompt_tokens"]), 0)
    else:
        grant.count(model, int(used.get("input_tokens") or 0), int(used.get("output_tokens") or 0))
