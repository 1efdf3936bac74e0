"""The fields of an inference key of the database: the schema every write is checked against
(the keys API's bodies, ``manage.py create_api_key``), and the JSON a key is shown as.

The limit fields are enforced at the edge (``models_app.quotas``, docs/api.md), and
``priority`` is the class the key's requests queue in (``models_app.api.keys``).  Each is a
whole number of at least 1 or null (no limit); 0, a negative, a bool, a string or a number past its
bound is refused, so a typo cannot store a limit that would refuse every request or none.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from runtime.config import API_KEY_NAME, ApiKey
from runtime.queue_terms import DEFAULT_PRIORITY, PRIORITY_CLASSES

# The prefix of every secret the keys API makes, so a leaked one is recognisable (secret scanners).
SECRET_PREFIX = "sk-llmpool-"
SETTINGS_ID_PREFIX = "settings:"
DATABASE_ID_PREFIX = "key_"

LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute", "max_concurrent", "token_budget", "budget_period",
                "priority", "fairness_key", "weight")


class KeyFields(BaseModel):
    """A key's fields as stored: a create body, or a row with a PATCH body laid over it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(pattern=API_KEY_NAME.pattern)
    models: list[str] | Literal["*"] = "*"
    disabled: bool = False
    requests_per_minute: int | None = Field(None, ge=1, le=1_000_000)
    tokens_per_minute: int | None = Field(None, ge=1, le=10**10)
    max_concurrent: int | None = Field(None, ge=1, le=100_000)
    token_budget: int | None = Field(None, ge=1, le=10**15)
    budget_period: Literal["day", "month"] | None = None
    priority: Literal[PRIORITY_CLASSES] = DEFAULT_PRIORITY
    fairness_key: str | None = Field(None, min_length=1, max_length=256)
    weight: float | None = Field(None, gt=0, le=1000, allow_inf_nan=False)

    _models = field_validator("models", mode="plain")(ApiKey._models.__func__)

    @model_validator(mode="after")
    def _budget_has_a_period(self):
        if (self.token_budget is None) != (self.budget_period is None):
            raise ValueError("token_budget and budget_period are set together (a budget per day or month) or not at all")
        return self


def database_id(pk: int) -> str:
    return f"{DATABASE_ID_PREFIX}{pk}"


def row_json(row) -> dict:
    """A database key as the keys API shows it: never its secret, nor its hash."""
    return {
        "id": database_id(row.pk),
        "source": "api",
        "name": row.name,
        "models": row.models,
        "disabled": row.disabled,
        **{name: getattr(row, name) for name in LIMIT_FIELDS},
        "created_at": row.created_at.isoformat().replace("+00:00", "Z"),
        "updated_at": row.updated_at.isoformat().replace("+00:00", "Z"),
    }


def settings_key_json(key: ApiKey) -> dict:
    """A key of settings.json as the keys API shows it (read-only; limits it has none)."""
    limits = dict.fromkeys(LIMIT_FIELDS)
    limits.update(priority="default", fairness_key=key.fairness_key, weight=key.weight)
    return {
        "id": f"{SETTINGS_ID_PREFIX}{key.name}",
        "source": "settings",
        "name": key.name,
        "models": key.models,
        "disabled": False,
        **limits,
        "created_at": None,
        "updated_at": None,
    }

