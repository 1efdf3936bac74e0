"""``Wire``: a dataclass that crosses the channel layer (and an engine process's socket) as a dict."""
from __future__ import annotations

import dataclasses
from typing import Any, Self


class Wire:
    """``to_wire`` is the dataclass as a plain dict; ``from_wire`` builds it back, leaving out a key
    it does not know (a field a newer sender added)."""

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Self:
        known = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})
