"""The admin's Load form, built from a model's live ``load_constraints``, and the Reconfigure
form of a loaded model (its ``"reconfigurable": true`` entries, prefilled with the effective values).

Fields only convert what the operator typed into the load body; the runtime
is the one validator, and its 422 / 400 / 409 answers are attached to the
fields they name.  An empty field is left out of the body (the configured
value holds); a ticked "null" box, or a select's null option, sends null.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django import forms

from models_app.selectors import effective_values
from runtime.errors import LLMPoolError

MIB = 1024 * 1024
NULL_SUFFIX = "__null"
KEEP = ""  # the empty choice: leave the field out of the body


@dataclass
class LoadRow:
    """One load body key as the template shows it."""

    name: str
    kind: str
    field: forms.BoundField
    null: forms.BoundField | None
    constraint: dict
    datalist: list[str]


@dataclass
class Preset:
    label: str
    values: dict[str, Any]

    @property
    def values_json(self) -> str:
        return json.dumps(self.values)


class LoadForm(forms.Form):
    def __init__(self, entry: dict, data=None):
        super().__init__(data)
        self.entry = entry
        self.constraints = {"replicas": self._replicas_constraint(entry), **entry["load_constraints"]}
        self._choice_values: dict[str, dict[str, Any]] = {}
        self._scales: dict[str, int] = {}
        for name, constraint in self.constraints.items():
            self._add_field(name, constraint)

    @staticmethod
    def _replicas_constraint(entry: dict) -> dict:
        return {"kind": "integer", "minimum": 1, "maximum": entry["replica_max"], "step": 1}

    # ---- building ------------------------------------------------------------------------
    def _add_field(self, name: str, constraint: dict) -> None:
        kind = constraint.get("kind", "string")
        allowed = constraint.get("allowed_values")
        help_text = self._help_text(name, constraint)
        if kind in ("enum", "boolean") or (kind == "integer_or_null" and allowed):
            values = [True, False] if kind == "boolean" else list(allowed)
            if kind == "integer_or_null":
                values = [None, *values]
            self._choice_values[name] = {_option(v): v for v in values}
            choices = [(KEEP, "— keep configured —")] + [(_option(v), self._label(v, constraint)) for v in values]
            self.fields[name] = forms.ChoiceField(required=False, choices=choices, help_text=help_text)
            return
        if kind in ("integer", "integer_or_null"):
            scale = MIB if constraint.get("unit") == "bytes" and constraint.get("display_unit") == "mib" else 1
            self._scales[name] = scale
            attrs = {key: _scaled(constraint[key], scale) for key in ("minimum", "maximum", "step") if key in constraint}
            widget = forms.NumberInput(attrs=_number_attrs(attrs, step_default=1))
            self.fields[name] = forms.IntegerField(required=False, widget=widget, help_text=help_text)
        elif kind == "float":
            widget = forms.NumberInput(attrs=_number_attrs(constraint, step_default="any"))
            self.fields[name] = forms.FloatField(required=False, widget=widget, help_text=help_text)
        elif kind == "string_list_or_null":  # names separated by commas
            help_text += " · names separated by commas"
            self.fields[name] = forms.CharField(required=False, help_text=help_text)
        else:  # string_or_null, and any kind this UI does not know yet: free text
            widget = forms.TextInput(attrs={"list": f"{name}-values", "autocomplete": "off"})
            self.fields[name] = forms.CharField(required=False, widget=widget, help_text=help_text)
        if kind.endswith("_or_null"):
            meaning = constraint.get("null_means") or (
                f"runtime default {constraint['default']}" if constraint.get("default") is not None else "unset"
            )
            self.fields[name + NULL_SUFFIX] = forms.BooleanField(required=False, label=f"null ({meaning})")

    def _help_text(self, name: str, constraint: dict) -> str:
        definition, override = self.entry["definition"], self.entry["load_override"]
        configured = definition.get(name, self.entry["replicas"] if name == "replicas" else None)
        parts = [f"configured: {_shown(configured, constraint)}"]
        if name in override:
            parts.append(f"loaded now: {_shown(override[name], constraint)}")
        elif name == "replicas" and self.entry.get("runtime_state") in ("loading", "loaded", "unloading"):
            parts.append(f"loaded now: {self.entry['replicas']}")
        if constraint.get("default") is not None:
            parts.append(f"runtime default: {_shown(constraint['default'], constraint)}")
        if constraint.get("display_unit") == "mib":
            parts.append("in MiB (sent as bytes)")
        if constraint.get("format"):
            parts.append(f"format: {constraint['format']}")
        return " · ".join(parts)

    @staticmethod
    def _label(value: Any, constraint: dict) -> str:
        if value is None:
            return f"null ({constraint.get('null_means', 'unset')})"
        return json.dumps(value) if isinstance(value, bool) else str(value)

    # ---- what the template shows -----------------------------------------------------------
    @property
    def rows(self) -> list[LoadRow]:
        rows = []
        for name, constraint in self.constraints.items():
            null = self[name + NULL_SUFFIX] if name + NULL_SUFFIX in self.fields else None
            datalist = []
            if isinstance(self.fields[name].widget, forms.TextInput):
                datalist = [str(v) for v in constraint.get("allowed_values") or constraint.get("examples") or []]
            rows.append(LoadRow(name, constraint.get("kind", "string"), self[name], null, constraint, datalist))
        return rows

    @property
    def presets(self) -> list[tuple[str, list[str], list[Preset]]]:
        """(title, notes, presets) of every pair_presets recommendation whose fields this form has."""
        groups = []
        for key, recommendation in self.entry["load_recommendations"].items():
            fields = recommendation.get("fields", [])
            if recommendation.get("kind") != "pair_presets" or not all(f in self.fields for f in fields):
                continue
            presets = [
                Preset(pair.get("label", key), {f: pair[f] for f in fields if f in pair})
                for pair in recommendation.get("recommended_pairs", [])
            ]
            groups.append((key.replace("_", " "), recommendation.get("notes", []), presets))
        return groups

    # ---- reading ---------------------------------------------------------------------------
    def load_body(self) -> dict[str, Any]:
        """The keys the operator set, converted to the load body's types (call after is_valid)."""
        body: dict[str, Any] = {}
        for name in self.constraints:
            if self.cleaned_data.get(name + NULL_SUFFIX):
                body[name] = None
                continue
            value = self.cleaned_data.get(name)
            if value is None or value == KEEP:
                continue
            if name in self._choice_values:
                value = self._choice_values[name][value]
            elif name in self._scales:
                value *= self._scales[name]
            elif self.constraints[name].get("kind") == "string_list_or_null":
                value = [item.strip() for item in value.split(",") if item.strip()]
            body[name] = value
        return body

    def add_runtime_error(self, exc: LLMPoolError) -> None:
        """Put the runtime's answer next to the fields it names, else above the form."""
        placed = False
        for problem in exc.details if isinstance(exc.details, list) else []:
            field = _field_of(problem.get("path") if isinstance(problem, dict) else None)
            if field in self.constraints:
                self.add_error(field, f"{exc.code}: {problem.get('message')}")
                placed = True
        if not placed and exc.param in self.constraints:
            self.add_error(exc.param, f"{exc.code}: {exc.message}")
            placed = True
        if not placed:
            self.add_error(None, f"{exc.code} (HTTP {exc.http_status}): {exc.message}")


class ReconfigureForm(LoadForm):
    """POST .../reconfigure's body from the reconfigurable constraints: each field starts at its
    effective value, and only the fields the operator changed are sent (the runtime validates)."""

    prefix = "reconfigure"

    def __init__(self, entry: dict, data=None):
        forms.Form.__init__(self, data)
        self.entry = entry
        self.constraints = reconfigurable_constraints(entry)
        self._choice_values, self._scales = {}, {}
        effective = {row["key"]: row["effective"] for row in effective_values(entry)}
        for name, constraint in self.constraints.items():
            self._add_field(name, constraint)
            value, field = effective.get(name), self.fields[name]
            if name in self._choice_values:
                field.choices = [choice for choice in field.choices if choice[0] != KEEP]
                field.initial = _option(value)
            elif value is None and name + NULL_SUFFIX in self.fields:
                self.fields[name + NULL_SUFFIX].initial = True
            elif value is not None:
                field.initial = _plain(_scaled(value, self._scales.get(name, 1)))

    def reconfigure_body(self) -> dict[str, Any]:
        """The fields the operator changed, converted as a load body's (call after is_valid)."""
        changed = set(self.changed_data)
        return {name: value for name, value in self.load_body().items()
                if name in changed or name + NULL_SUFFIX in changed}


def reconfigurable_constraints(entry: dict) -> dict:
    """The load_constraints entries that say ``"reconfigurable": true``."""
    return {name: c for name, c in entry["load_constraints"].items() if c.get("reconfigurable")}


def _field_of(path: str | None) -> str | None:
    if not path or not path.startswith("$."):
        return None
    return path[2:].split(".", 1)[0].split("[", 1)[0]


def _option(value: Any) -> str:
    if value is None:
        return "null"
    return value if isinstance(value, str) else json.dumps(value)


def _scaled(value, scale: int):
    return value / scale if scale != 1 else value


def _number_attrs(constraint: dict, *, step_default) -> dict:
    attrs = {"step": constraint.get("step", step_default)}
    if "minimum" in constraint:
        attrs["min"] = constraint["minimum"]
    if "maximum" in constraint:
        attrs["max"] = constraint["maximum"]
    return {key: _plain(value) for key, value in attrs.items()}


def _plain(value):
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _shown(value: Any, constraint: dict) -> str:
    if value is None:
        return "null"
    if isinstance(value, int) and not isinstance(value, bool) and constraint.get("display_unit") == "mib":
        return f"{value / MIB:g} MiB"
    return json.dumps(value) if isinstance(value, bool) else str(value)
