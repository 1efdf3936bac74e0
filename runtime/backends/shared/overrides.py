"""Load overrides, each declared once next to its backend's definition.

A ``LoadOverride`` names one load-body field with the two things every other
shape is derived from:

- ``body_type``: its type and basic range in the load body.  The load-body schema
  (``load_body_model``, a pydantic model built from every backend's declarations)
  uses it, so a value that fails it is 422 ``invalid_load_body``.
- ``constraint``: its ``load_constraints`` entry, exactly as the admin API shows
  it.  ``check_against_constraint`` applies it to a schema-valid value, so a value
  outside it is 400 ``invalid_load_request``.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from runtime.errors import InvalidLoadRequest

# A signed 64-bit integer at most: what the channel between the API and the runtime carries.
MAX_INTEGER = 2**63 - 1
PositiveInt = Annotated[int, Field(ge=1, le=MAX_INTEGER)]
MIB_256 = 268435456  # the step of the KV-cache byte sizes the GPU backends take


@dataclass(frozen=True)
class LoadOverride:
    name: str
    body_type: Any
    constraint: dict
    # Values the 400 check accepts beyond the constraint's allowed_values (the admin lists only those).
    also_accepted: tuple = ()

    def check(self, value: Any) -> None:
        """Raise InvalidLoadRequest (400) when a non-null, schema-valid ``value`` breaks the constraint."""
        check_against_constraint(self.name, value, self.constraint, self.also_accepted)


# Every concurrent backend takes it; the others answer effective_target_inflight 1.
TARGET_INFLIGHT = LoadOverride(
    "target_inflight", Annotated[int, Field(ge=1, le=4096)], {"kind": "integer", "minimum": 1, "step": 1}
)


def integer_override(name: str, minimum: int = 1, step: int = 1, **extra) -> LoadOverride:
    """An integer override at least ``minimum`` (a multiple of ``step`` above it); ``extra`` joins the constraint."""
    return LoadOverride(name, PositiveInt if minimum >= 1 else Annotated[int, Field(ge=minimum, le=MAX_INTEGER)],
                        {"kind": "integer", "minimum": minimum, "step": step, **extra})


class _LoadBodyBase(BaseModel):
    """Every field any backend accepts in a load body, with its type and basic range.

    Failing this schema is a 422; whether a field fits the model's backend, and
    backend-specific ranges, are checked by the backend spec (400).
    """

    model_config = ConfigDict(extra="forbid", strict=True)


def load_body_model(declarations: Iterable[LoadOverride]) -> type[BaseModel]:
    """The load-body schema: ``replicas`` plus each declared override, optional and nullable.

    A field two backends share (vllm and vllm_serve) must be declared alike.
    """
    fields: dict[str, Any] = {"replicas": (PositiveInt | None, None)}
    seen: dict[str, LoadOverride] = {}
    for declaration in declarations:
        earlier = seen.setdefault(declaration.name, declaration)
        if earlier is not declaration and earlier.body_type != declaration.body_type:
            raise TypeError(f"load override {declaration.name} is declared twice with different body types")
        fields.setdefault(declaration.name, (declaration.body_type | None, None))
    return create_model("LoadBody", __base__=_LoadBodyBase, **fields)


def fields_fit(problem_of):
    """A definition's ``model_validator`` for a rule over several fields: ``problem_of(config)``
    answers ``(field, why)`` or None, and a problem is the definition's ValueError."""
    def validator(definition):
        problem = problem_of(definition.model_dump())
        if problem is not None:
            raise ValueError(problem[1])
        return definition

    return validator


def refuse_problem(problem: tuple[str, str] | None) -> None:
    """The load body's side of ``fields_fit``: a problem ``(field, why)`` is 400 invalid_load_request."""
    if problem is not None:
        raise InvalidLoadRequest(problem[1], param=problem[0])


def check_against_constraint(key: str, value: Any, constraint: dict, extra_accepted: tuple = ()) -> None:
    """Apply a load_constraints entry to one non-null override value (400 on violation)."""
    allowed = constraint.get("allowed_values")
    if allowed is not None and value not in allowed and value not in extra_accepted:
        raise InvalidLoadRequest(
            f"{key}={value!r} is not allowed; allowed values: {', '.join(map(str, allowed))}", param=key
        )
    kind = constraint.get("kind")
    if kind in ("integer", "integer_or_null", "float") and not isinstance(value, bool):
        minimum, maximum = constraint.get("minimum"), constraint.get("maximum")
        if minimum is not None and value < minimum:
            raise InvalidLoadRequest(f"{key} must be at least {minimum} (got {value})", param=key)
        if maximum is not None and value > maximum:
            raise InvalidLoadRequest(f"{key} must be at most {maximum} (got {value})", param=key)
        step = constraint.get("step")
        if kind != "float" and step and step > 1 and (value - (minimum or 0)) % step:
            raise InvalidLoadRequest(f"{key} must be a multiple of {step} (got {value})", param=key)
