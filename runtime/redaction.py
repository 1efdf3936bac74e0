"""Secrets in model definitions: how a field is marked as holding one, and the redacted view.

A definition field that holds a secret carries ``SECRET`` (or ``SECRET_FLAG_VALUES``) in its
``json_schema_extra``, so its JSON schema says ``"secret": true`` (or ``"flag_values"``).  The
runtime reads the real value from the definition object; whatever shows a definition outside the
runtime (the admin API, the admin WebSocket and its events, the workbench pages, the catalog mirror
in the database) shows ``redacted_dump`` of it instead:

- a set value becomes ``REDACTED``, null stays null;
- a mapping (an environment, request headers) keeps its keys, each value ``REDACTED``;
- an argument list (``SECRET_FLAG_VALUES``) keeps every argument but the value of a flag whose name
  ends in ``api-key``, ``token``, ``secret`` or ``password`` (``--hf-token X``, ``--api-key=X``).
"""
from __future__ import annotations

import functools
import re
from typing import Any

from pydantic import BaseModel

REDACTED = "********"
SECRET = {"secret": True}
SECRET_FLAG_VALUES = {"secret": "flag_values"}
SECRET_FLAG = re.compile(r"^--?[a-z0-9_-]*(api[-_]?key|token|secret|password)$", re.IGNORECASE)


@functools.cache
def secret_fields(model_type: type[BaseModel]) -> dict[str, Any]:
    """``{field name: its secret mark}`` for every field of ``model_type`` marked as a secret."""
    marks = {}
    for name, field in model_type.model_fields.items():
        extra = field.json_schema_extra
        if isinstance(extra, dict) and extra.get("secret"):
            marks[name] = extra["secret"]
    return marks


def redacted_dump(model: BaseModel) -> dict[str, Any]:
    """``model.model_dump()`` with every secret field redacted."""
    dumped = model.model_dump()
    for name, mark in secret_fields(type(model)).items():
        dumped[name] = redact(dumped[name], mark)
    return dumped


def redact(value: Any, mark: Any = True) -> Any:
    if value is None:
        return None
    if mark == SECRET_FLAG_VALUES["secret"]:
        return redact_flag_values(value)
    if isinstance(value, dict):
        return {key: REDACTED for key in value}
    return REDACTED


def redact_flag_values(args: list[str]) -> list[str]:
    """``args`` with the value of each secret flag (the next argument, or after ``=``) redacted."""
    redacted: list[str] = []
    value_is_secret = False
    for arg in args:
        if value_is_secret:
            redacted.append(REDACTED)
            value_is_secret = False
            continue
        flag, equals, _ = arg.partition("=")
        if SECRET_FLAG.match(flag):
            value_is_secret = not equals
            arg = f"{flag}={REDACTED}" if equals else arg
        redacted.append(arg)
    return redacted
