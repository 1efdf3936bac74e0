"""Which runtime workers serve a model: its optional ``node`` field (a node name or a list of
them, docs/settings.md), read from the merged settings before the backends' definitions are
validated, checked against the swap groups, and the catalog of one node."""
from __future__ import annotations

import re
from typing import Any

# A node name as a channel name can carry it (models_app.transport.nodes sanitises a host name to it).
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$")


def serves(nodes: list[str] | None, node: str | None) -> bool:
    """Whether the runtime of ``node`` serves a model whose ``node`` field is ``nodes``: a model
    without the field is served by every node; ``node`` None (no node named) serves everything."""
    return node is None or nodes is None or node in nodes


def _node_field(name: str, value: Any) -> tuple[list[str] | None, dict | None]:
    """A model's ``node`` as a list of names, or its problem (``code`` node_invalid)."""
    where = f"$.models.{name}.node"
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names:
        return None, {"path": where, "code": "node_invalid",
                      "message": "must be a node name or a non-empty list of node names"}
    for index, item in enumerate(names):
        if not isinstance(item, str) or not NODE_NAME.match(item):
            at = where if isinstance(value, str) else f"{where}[{index}]"
            return None, {"path": at, "code": "node_invalid",
                          "message": f"node name {item!r} must match {NODE_NAME.pattern}"}
    if len(set(names)) != len(names):
        return None, {"path": where, "code": "node_invalid", "message": "a node is named twice"}
    return names, None


def take_node_fields(merged: dict) -> tuple[dict[str, list[str] | None], list[dict]]:
    """Remove every model's ``node`` from ``merged`` (the backends' definitions do not have it) and
    answer them per model, with the problem of each bad one (it has a ``code``)."""
    nodes: dict[str, list[str] | None] = {}
    problems = []
    models = merged.get("models")
    if not isinstance(models, dict):
        return nodes, problems
    for name, definition in list(models.items()):
        if not isinstance(definition, dict) or "node" not in definition:
            nodes[name] = None
            continue
        definition = dict(definition)
        value = definition.pop("node")
        models[name] = definition
        if value is None:
            nodes[name] = None
            continue
        nodes[name], problem = _node_field(name, value)
        if problem is not None:
            problems.append(problem)
    return nodes, problems


def node_problems(settings: Any, nodes: dict[str, list[str] | None]) -> list[dict]:
    """A swap group whose members are not served by the same nodes (a group is enforced per node)."""
    problems = []
    for group, config in settings.groups.items():
        first = config.members[0]
        for index, member in enumerate(config.members):
            if sorted(nodes.get(member) or []) != sorted(nodes.get(first) or []):
                problems.append({
                    "path": f"$.groups.{group}.members[{index}]", "code": "node_group_split",
                    "message": f"{member!r} is not served by the same nodes as {first!r}: a swap group "
                    "holds models of the same node(s)",
                })
    return problems


def for_node(settings: Any, nodes: dict[str, list[str] | None], node: str | None) -> Any:
    """``settings`` (runtime.config.Settings) with only the models ``node`` serves (and the swap
    groups of those)."""
    if node is None or all(serves(nodes.get(name), node) for name in settings.models):
        return settings
    models = {name: d for name, d in settings.models.items() if serves(nodes.get(name), node)}
    groups = {
        name: config.model_copy(update={"members": [m for m in config.members if m in models]})
        for name, config in settings.groups.items()
        if any(m in models for m in config.members)
    }
    return settings.model_copy(update={"models": models, "groups": groups})
