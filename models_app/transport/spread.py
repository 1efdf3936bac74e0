"""Admin calls on a model that several alive nodes serve (its ``node`` a list, or absent with several
nodes): its replicas are spread over them, all or nothing.

- ``load``: the replica count (the body's ``replicas``, else the definition's) is split over the
  alive nodes that serve the model, those where one replica fits now first (each node's dry run),
  then in name order, the first ones taking one more where it does not divide (3 over two nodes:
  2 + 1; 1 over two nodes: the first only).  Every share loads at once.
  One share fails: every node this load brought up is unloaded again and the answer is that
  node's error, its message starting ``node <name>:``.  ``?dry_run=true`` answers each share's
  plan (``nodes``) and ``fits`` only when every share fits.
- ``unload``, ``reconfigure``, ``sleep``, ``wake``: every node that serves it.

The answer is the first node's entry with the totals over the nodes (``replicas``,
``loaded_replicas``, ``inflight_requests``, ``queue_depth``) and ``nodes``: each node's ``node``,
``runtime_state``, ``replicas`` and ``loaded_replicas``.
"""
from __future__ import annotations

import asyncio

from models_app.transport import nodes as pool_nodes
from models_app.transport.messages import OP_GET_MODEL, OP_LOAD, OP_RECONFIGURE, OP_SLEEP, OP_UNLOAD, OP_WAKE
from runtime.errors import LLMPoolError

SPREAD_OPS = {OP_LOAD, OP_UNLOAD, OP_RECONFIGURE, OP_SLEEP, OP_WAKE}
TOTALS = ("replicas", "loaded_replicas", "inflight_requests", "queue_depth")


async def serving(model: str | None) -> list[pool_nodes.Node]:
    """The alive nodes that serve ``model``, by name (a spread call needs two or more)."""
    if model is None or not pool_nodes.is_split():
        return []
    return [n for n in await pool_nodes.REGISTRY.nodes() if n.alive and n.serves(model)]


def shares(replicas: int, count: int) -> list[int]:
    """``replicas`` over ``count`` nodes in order, the first ones one more; zeros left out."""
    base, extra = divmod(replicas, count)
    return [k for k in (base + (1 if i < extra else 0) for i in range(count)) if k > 0]


async def call_spread(client_factory, op: str, payload: dict, deadline, nodes: list[pool_nodes.Node]) -> dict:
    if op == OP_LOAD:
        return await _load(client_factory, payload, deadline, nodes)
    answers = await _each(client_factory, [(n, payload) for n in nodes], op, deadline)
    _raise_first(answers)
    return _combined(answers)


async def _each(client_factory, calls, op, deadline) -> dict[str, dict | BaseException]:
    results = await asyncio.gather(
        *(client_factory(node.channel).call(op, payload, deadline=deadline) for node, payload in calls),
        return_exceptions=True,
    )
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result
    return {node.name: result for (node, _), result in zip(calls, results)}


async def _load(client_factory, payload, deadline, nodes) -> dict:
    name = payload["name"]
    body = dict(payload.get("body") or {})
    replicas = body.get("replicas")
    if replicas is None:
        first = await client_factory(nodes[0].channel).call(OP_GET_MODEL, {"name": name})
        replicas = first["definition"]["replicas"]
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        # Not a count to split: the first node checks the body and answers its error.
        return await client_factory(nodes[0].channel).call(OP_LOAD, payload, deadline=deadline)
    if not payload.get("dry_run"):
        nodes = await _with_room_first(client_factory, name, body, nodes, deadline)
    split = shares(replicas, len(nodes))
    calls = [(node, {**payload, "body": {**body, "replicas": k}}) for node, k in zip(nodes, split)]
    if payload.get("dry_run"):
        plans = await _each(client_factory, calls, OP_LOAD, deadline)
        _raise_first(plans)
        first = next(iter(plans.values()))
        return {**first, "fits": all(p.get("fits") for p in plans.values()),
                "nodes": [{"node": n, **p} for n, p in plans.items()]}
    before = {node.name: (node.model(name) or {}).get("runtime_state") for node, _ in calls}
    answers = await _each(client_factory, calls, OP_LOAD, deadline)
    failed = [n for n, a in answers.items() if isinstance(a, BaseException) or a.get("runtime_state") != "loaded"]
    if failed:
        brought_up = [node for node, _ in calls if node.name not in failed and before[node.name] != "loaded"]
        await _each(client_factory, [(n, {"name": name}) for n in brought_up], OP_UNLOAD, deadline)
        _raise_first({n: answers[n] for n in failed}, failed_entry=True)
    return _combined(answers)


async def _with_room_first(client_factory, name, body, nodes, deadline) -> list[pool_nodes.Node]:
    """``nodes`` with those where one replica fits now first (each node's dry run: runtime.pool.memory),
    in name order within each kind: the shares then go to the nodes with room."""
    one = {**body, "replicas": 1}
    plans = await _each(client_factory, [(n, {"name": name, "body": one, "dry_run": True}) for n in nodes], OP_LOAD,
                        deadline)
    return sorted(nodes, key=lambda n: not (isinstance(plans[n.name], dict) and plans[n.name].get("fits", True)))


def _raise_first(answers: dict, *, failed_entry: bool = False) -> None:
    for node, answer in answers.items():
        if isinstance(answer, LLMPoolError):
            error = type(answer)(f"node {node}: {answer.message}", param=answer.param, details=answer.details)
            error.code, error.http_status = answer.code, answer.http_status
            raise error
        if isinstance(answer, BaseException):
            raise LLMPoolError(f"node {node}: {answer}")
        if failed_entry:  # a load answered, but not loaded (failed): its entry says why
            raise LLMPoolError(f"node {node}: the load ended {answer.get('runtime_state')}: {answer.get('last_error')}")


def _combined(answers: dict[str, dict]) -> dict:
    first_node, first = next(iter(answers.items()))
    combined = {**first, "node": first_node}
    entries = {n: a for n, a in answers.items() if isinstance(a, dict) and "runtime_state" in a}
    for key in TOTALS:
        if all(isinstance(a.get(key), int) for a in entries.values()):
            combined[key] = sum(a[key] for a in entries.values())
    combined["nodes"] = [
        {"node": n, "runtime_state": a["runtime_state"], "replicas": a.get("replicas"),
         "loaded_replicas": a.get("loaded_replicas")}
        for n, a in entries.items()
    ]
    return combined
