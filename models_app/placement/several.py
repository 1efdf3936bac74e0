"""Sending one call to several nodes and merging their answers (``decide.Every``, ``decide.Spread``).

A pool call (``Every``): with one node the answer is that node's (``list_models``: each entry with its
``node``); with several, the merge of ``merges.MERGES`` and ``nodes``, one line per known node (a node
that does not answer is listed with its error, every other node's part is answered; all failing: the
first error).  ``reload_settings`` is two-phase over every alive node (check everywhere, then swap
everywhere): one node's refusal aborts the others, so every catalog stays as it was.

A spread admin call (``Spread``: a model that several alive nodes serve, its replicas over them, all
or nothing):

- ``load``: the replica count (the body's ``replicas``, else the definition's) is split over the
  nodes, those where one replica fits now first (each node's dry run), then in name order, the first
  ones taking one more where it does not divide (3 over two nodes: 2 + 1; 1 over two nodes: the first
  only).  Every share loads at once.  One share fails: every node this load brought up is unloaded
  again and the answer is that node's error, its message starting ``node <name>:``.
  ``?dry_run=true`` answers each share's plan (``nodes``) and ``fits`` only when every share fits.
- ``unload``, ``reconfigure``, ``sleep``, ``wake``: every node that serves it.

The answer is ``merges.combined``.
"""
from __future__ import annotations

import asyncio
import logging
import uuid

from models_app.placement import merges
from models_app.transport.messages import (
    OP_GET_MODEL,
    OP_LIST_MODELS,
    OP_LOAD,
    OP_METRICS,
    OP_RELOAD_ABORT,
    OP_RELOAD_COMMIT,
    OP_RELOAD_PREPARE,
    OP_RELOAD_SETTINGS,
    OP_UNLOAD,
)
from models_app.transport.nodes import EXPIRY_SECONDS, Node
from models_app.transport.runtime_client import RuntimeClient
from runtime.errors import LLMPoolError

logger = logging.getLogger("llmpool.api")


async def ask(client: RuntimeClient, calls: list[tuple[Node, dict]], op: str, deadline) -> dict:
    """Node name -> its answer to ``op`` (or the error it raised), every node asked at once."""
    results = await asyncio.gather(
        *(client.call(node.channel, op, payload, deadline=deadline) for node, payload in calls),
        return_exceptions=True,
    )
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result  # a cancel of the caller
    return {node.name: result for (node, _), result in zip(calls, results)}


async def call_every(client: RuntimeClient, op: str, payload: dict, deadline, nodes: list[Node],
                     known: list[Node]) -> dict:
    if op == OP_RELOAD_SETTINGS:
        return await _reload(client, nodes, deadline)
    answers = await ask(client, [(n, payload) for n in nodes], op, deadline)
    ok = {name: answer for name, answer in answers.items() if not isinstance(answer, BaseException)}
    if not ok:
        raise next(iter(answers.values()))
    several = len(nodes) > 1 or len(known) > 1
    if not several and op != OP_LIST_MODELS:  # one node: its answer as it gave it
        return next(iter(ok.values()))
    merged = merges.MERGES[op](ok, payload)
    per_node = merged.pop("per_node", {})
    if several and op != OP_METRICS:
        merged["nodes"] = [
            {**merges.status(node.name, answers[node.name]), **per_node.get(node.name, {})}
            if node.name in answers
            else {"node": node.name, "alive": False, "error": {"code": "runtime_unavailable", "message": (
                f"no heartbeat within {EXPIRY_SECONDS:g} s")}}
            for node in sorted({n.name: n for n in [*known, *nodes]}.values(), key=lambda n: n.name)
        ]
    return merged


async def _reload(client: RuntimeClient, nodes: list[Node], deadline) -> dict:
    """One node: the plain reload.  Several: prepare on every node (each checks and holds), then
    commit on every node; a refusal aborts every prepared node and is the answer (with ``details``
    naming the node); a commit that fails after others committed is logged and answered per node."""
    if len(nodes) == 1:
        return await client.call(nodes[0].channel, OP_RELOAD_SETTINGS, {}, deadline=deadline)
    reload_id = {"reload_id": uuid.uuid4().hex}
    prepared = await ask(client, [(n, reload_id) for n in nodes], OP_RELOAD_PREPARE, deadline)
    refused = {name: answer for name, answer in prepared.items() if isinstance(answer, BaseException)}
    if refused:
        await ask(client, [(n, reload_id) for n in nodes], OP_RELOAD_ABORT, deadline)
        name, error = next(iter(refused.items()))
        if not isinstance(error, LLMPoolError):
            error = LLMPoolError(str(error))
        refusals = [{"node": n, "code": getattr(e, "code", "internal_error"), "message": getattr(e, "message", str(e)),
                     "details": getattr(e, "details", None)} for n, e in refused.items()]
        answer = type(error)(f"node {name}: {error.message}", param=error.param, details={
            "refused_by": refusals, "problems": error.details})
        answer.code, answer.http_status = error.code, error.http_status
        raise answer
    committed = await ask(client, [(n, reload_id) for n in nodes], OP_RELOAD_COMMIT, deadline)
    for name, error in committed.items():
        if isinstance(error, BaseException):
            logger.error("settings reload: node %s failed to commit after the others prepared: %s", name, error)
    return merges.reload_diffs(committed)


async def call_spread(client: RuntimeClient, op: str, payload: dict, deadline, nodes: list[Node]) -> dict:
    if op == OP_LOAD:
        return await _load(client, payload, deadline, nodes)
    answers = await ask(client, [(n, payload) for n in nodes], op, deadline)
    _raise_first(answers)
    return merges.combined(answers)


async def _load(client: RuntimeClient, payload: dict, deadline, nodes: list[Node]) -> dict:
    name = payload["name"]
    body = dict(payload.get("body") or {})
    replicas = body.get("replicas")
    if replicas is None:
        first = await client.call(nodes[0].channel, OP_GET_MODEL, {"name": name})
        replicas = first["definition"]["replicas"]
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        # Not a count to split: the first node checks the body and answers its error.
        return await client.call(nodes[0].channel, OP_LOAD, payload, deadline=deadline)
    if not payload.get("dry_run"):
        nodes = await _with_room_first(client, name, body, nodes, deadline)
    split = merges.shares(replicas, len(nodes))
    calls = [(node, {**payload, "body": {**body, "replicas": k}}) for node, k in zip(nodes, split)]
    if payload.get("dry_run"):
        plans = await ask(client, calls, OP_LOAD, deadline)
        _raise_first(plans)
        first = next(iter(plans.values()))
        return {**first, "fits": all(p.get("fits") for p in plans.values()),
                "nodes": [{"node": n, **p} for n, p in plans.items()]}
    before = {node.name: (node.model(name) or {}).get("runtime_state") for node, _ in calls}
    answers = await ask(client, calls, OP_LOAD, deadline)
    failed = [n for n, a in answers.items() if isinstance(a, BaseException) or a.get("runtime_state") != "loaded"]
    if failed:
        brought_up = [node for node, _ in calls if node.name not in failed and before[node.name] != "loaded"]
        await ask(client, [(n, {"name": name}) for n in brought_up], OP_UNLOAD, deadline)
        _raise_first({n: answers[n] for n in failed}, failed_entry=True)
    return merges.combined(answers)


async def _with_room_first(client: RuntimeClient, name: str, body: dict, nodes: list[Node], deadline) -> list[Node]:
    """``nodes`` with those where one replica fits now first (each node's dry run: runtime.pool.memory),
    in name order within each kind: the shares then go to the nodes with room."""
    one = {**body, "replicas": 1}
    plans = await ask(client, [(n, {"name": name, "body": one, "dry_run": True}) for n in nodes], OP_LOAD, deadline)
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
