"""The fields of an inference key of the database: the schema every write is checked against
(the keys API's bodies, ``manage.py create_api_key``), and the JSON a key is shown as.

Besides its name, models and ``disabled``, a key has the limits and queue terms of
``runtime.key_terms.KeyTerms``, the same a key of settings.json may declare: 0, a negative, a
bool, a string or a number past its bound is refused.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from runtime.config import API_KEY_NAME, ApiKey
from runtime.key_terms import KeyTerms

# The prefix of every secret the keys API makes, so a leaked one is recognisable (secret scanners).
SECRET_PREFIX = "sk-llmpool-"
SETTINGS_ID_PREFIX = "settings:"
DATABASE_ID_PREFIX = "key_"

LIMIT_FIELDS = tuple(KeyTerms.model_fields)


class KeyFields(KeyTerms):
    """A key's fields as stored: a create body, or a row with a PATCH body laid over it."""

    name: str = Field(pattern=API_KEY_NAME.pattern)
    models: list[str] | Literal["*"] = "*"
    disabled: bool = False

    _models = field_validator("models", mode="plain")(ApiKey._models.__func__)


def database_id(pk: int) -> str:
    return f"{DATABASE_ID_PREFIX}{pk}"


def settings_id(name: str) -> str:
    """The id of a key of settings.json: what the keys API shows, and what its limits and usage are
    counted under (a database key's are counted under its primary key)."""
    return f"{SETTINGS_ID_PREFIX}{name}"


def usage_owner(key: int | str) -> dict:
    """The usage rows' fields (``models.KeyUsage``) that name the key of the quota key ``key``."""
    if isinstance(key, str):
        return {"settings_key": key.removeprefix(SETTINGS_ID_PREFIX)}
    return {"key_id": key}


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
    """A key of settings.json as the keys API shows it (read-only)."""
    limits = {name: getattr(key, name) for name in LIMIT_FIELDS}
    return {
        "id": settings_id(key.name),
        "source": "settings",
        "name": key.name,
        "models": key.models,
        "disabled": False,
        **limits,
        "created_at": None,
        "updated_at": None,
    }

