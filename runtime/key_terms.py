"""What an inference key carries besides who it is (``KeyTerms``): its limits, the terms its
requests queue on, and its share of the token-fair order.  Declared once, for a key of settings.json
(``runtime.config.ApiKey``, read-only) and a key of the database (``models_app.key_fields.KeyFields``).

The limits are enforced at the edge (``models_app.quotas``); each is a whole number of at least 1 or
null (no limit), so a typo cannot declare a limit that would refuse every request or none, and a
budget is per ``day`` or ``month``, both set or neither.  ``priority`` is the class the key's
requests queue in, ``queue_timeout_seconds`` the longest they wait before they start (the queue
timeout header may only shorten it), ``fairness_key`` the bucket they share (else the key's name),
and ``weight`` that bucket's share: the scheduler divides its tokens by it.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from runtime.queue_terms import DEFAULT_PRIORITY, MAX_QUEUE_TIMEOUT_SECONDS, MAX_WEIGHT, PRIORITY_CLASSES

# The fields of ``KeyTerms`` that limit a key's requests at the edge.
LIMIT_NAMES = ("requests_per_minute", "tokens_per_minute", "max_concurrent", "token_budget", "budget_period")


class KeyTerms(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    requests_per_minute: int | None = Field(None, ge=1, le=1_000_000)
    tokens_per_minute: int | None = Field(None, ge=1, le=10**10)
    max_concurrent: int | None = Field(None, ge=1, le=100_000)
    token_budget: int | None = Field(None, ge=1, le=10**15)
    budget_period: Literal["day", "month"] | None = None
    priority: Literal[PRIORITY_CLASSES] = DEFAULT_PRIORITY
    queue_timeout_seconds: float | None = Field(None, gt=0, le=MAX_QUEUE_TIMEOUT_SECONDS, allow_inf_nan=False)
    fairness_key: str | None = Field(None, min_length=1, max_length=256)
    weight: float | None = Field(None, gt=0, le=MAX_WEIGHT, allow_inf_nan=False)

    @model_validator(mode="after")
    def _budget_has_a_period(self):
        if (self.token_budget is None) != (self.budget_period is None):
            raise ValueError("token_budget and budget_period are set together (a budget per day or month) or not at all")
        return self
