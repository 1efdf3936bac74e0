"""Calls that concern the whole pool: asked of every alive node and merged into one answer.

``RuntimeClient.call`` sends these operations here; everything else names one model and goes to the
node that serves it (``models_app.transport.nodes.route``).  With one node the answer is that node's,
each entry with its ``node``; with several, the entries of all of them (docs/api.md):

- ``list_models``: every node's entries; a node that does not answer is listed in ``nodes`` with
  its error, and every other node's entries are answered (all failing: the first error);
- ``gpu_memory``: every node's gpus, models and devices (each with ``node``), and ``nodes``, one
  entry per node with its own gpus, devices and error;
- ``catalog``: the models of every node (a model two nodes serve once) and ``nodes``;
- ``activity``: the requests of every node, newest first (``limit`` applied after the merge);
- ``metrics``: every node's samples with a ``node`` label, one family after another;
- ``reload_settings``: two-phase over every alive node (check everywhere, then swap everywhere);
  one node's refusal aborts the others, so every catalog stays as it was.
"""
from __future__ import annotations

import asyncio
import logging
import uuid

from models_app.transport import nodes as pool_nodes
from models_app.transport.messages import (
    OP_ACTIVITY,
    OP_CATALOG,
    OP_GPU_MEMORY,
    OP_LIST_MODELS,
    OP_METRICS,
    OP_RELOAD_ABORT,
    OP_RELOAD_COMMIT,
    OP_RELOAD_PREPARE,
    OP_RELOAD_SETTINGS,
)
from runtime.errors import LLMPoolError, RuntimeUnavailable

logger = logging.getLogger("llmpool.api")

POOL_OPS = {OP_LIST_MODELS, OP_GPU_MEMORY, OP_CATALOG, OP_METRICS, OP_RELOAD_SETTINGS, OP_ACTIVITY}


def is_pool_call(op: str, payload: dict) -> bool:
    """Whether ``op`` goes to every node (activity only without a model: with one, to its node)."""
    return op in POOL_OPS and not (op == OP_ACTIVITY and payload.get("model"))


async def targets() -> list[pool_nodes.Node]:
    """The nodes a pool call asks: the alive ones; none alive, this process's own node's channel
    (which answers 503 runtime_unavailable within the reply timeout if no runtime starts there)."""
    known = await pool_nodes.REGISTRY.nodes()
    alive = [n for n in known if n.alive]
    if alive:
        return alive
    own = pool_nodes.this_node()
    if pool_nodes.is_split() and known and own not in {n.name for n in known}:
        down = ", ".join(n.name for n in known)
        raise RuntimeUnavailable(f"no node of the pool is alive (known: {down})")
    return [next((n for n in known if n.name == own), pool_nodes.Node(own, pool_nodes.node_channel(own), False))]


async def call_pool(client_factory, op: str, payload: dict, deadline: float | None) -> dict:
    nodes = await targets()
    known = await pool_nodes.REGISTRY.nodes()
    if op == OP_RELOAD_SETTINGS:
        return await _reload(client_factory, nodes, deadline)
    answers = await _ask(client_factory, nodes, op, payload, deadline)
    ok = {name: answer for name, answer in answers.items() if not isinstance(answer, BaseException)}
    if not ok:
        raise next(iter(answers.values()))
    merge = {OP_LIST_MODELS: _models, OP_GPU_MEMORY: _gpu_memory, OP_CATALOG: _catalog,
             OP_ACTIVITY: _activity, OP_METRICS: _metrics}[op]
    several = len(nodes) > 1 or len(known) > 1
    if not several and op != OP_LIST_MODELS:  # one node: its answer as it gave it
        return next(iter(ok.values()))
    merged = merge(ok, payload)
    if several:
        per_node = merged.pop("per_node", {})
        if op != OP_METRICS:
            merged["nodes"] = [
                {**_status(node, answers[node.name]), **per_node.get(node.name, {})} if node.name in answers
                else {"node": node.name, "alive": False, "error": {"code": "runtime_unavailable", "message": (
                    f"no heartbeat within {pool_nodes.EXPIRY_SECONDS:g} s")}}
                for node in sorted({n.name: n for n in [*known, *nodes]}.values(), key=lambda n: n.name)
            ]
    merged.pop("per_node", None)
    return merged


async def _ask(client_factory, nodes, op, payload, deadline) -> dict[str, dict | BaseException]:
    results = await asyncio.gather(
        *(client_factory(node.channel).call(op, payload, deadline=deadline) for node in nodes),
        return_exceptions=True,
    )
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result  # a cancel of the caller
    return {node.name: result for node, result in zip(nodes, results)}


def _status(node: pool_nodes.Node, answer) -> dict:
    status = {"node": node.name, "alive": not isinstance(answer, BaseException)}
    if isinstance(answer, LLMPoolError):
        status["error"] = {"code": answer.code, "message": answer.message}
    elif isinstance(answer, BaseException):
        status["error"] = {"code": "internal_error", "message": str(answer)}
    return status


def with_node(item, node: str):
    return {**item, "node": node} if isinstance(item, dict) else item


def _models(ok: dict, payload: dict) -> dict:
    """Every AdminModelEntry says its node, with one node or several."""
    return {"models": [with_node(entry, node) for node, answer in ok.items() for entry in answer["models"]]}


def _gpu_memory(ok: dict, payload: dict) -> dict:
    merged = {"gpus": [], "models": [], "error": None, "devices": [], "per_node": {}}
    for node, answer in ok.items():
        for key in ("gpus", "models", "devices"):
            merged[key] += [with_node(item, node) for item in answer.get(key) or []]
        merged["error"] = merged["error"] or answer.get("error")
        merged["per_node"][node] = {"gpus": answer.get("gpus") or [], "devices": answer.get("devices") or [],
                                    "gpu_error": answer.get("error")}
    return merged


def _catalog(ok: dict, payload: dict) -> dict:
    models, seen, configured = [], set(), set()
    for node, answer in ok.items():
        configured.update(answer.get("configured_models") or ())
        for model in answer["models"]:
            if model["name"] not in seen:
                seen.add(model["name"])
                models.append(model)
    first = next(iter(ok.values()))
    return {"models": models, "service": first.get("service"), "configured_models": sorted(configured | seen)}


def _activity(ok: dict, payload: dict) -> dict:
    requests = [with_node(item, node) for node, answer in ok.items() for item in answer["requests"]]
    requests.sort(key=lambda r: r.get("at") or "", reverse=True)
    first = next(iter(ok.values()))
    limit = payload.get("limit")
    size = first.get("size")
    return {"requests": requests[: int(limit)] if limit else requests[:size] if size else requests,
            "size": size, "capture_requests": first.get("capture_requests")}


def _metrics(ok: dict, payload: dict) -> dict:
    if len(ok) == 1:
        return next(iter(ok.values()))
    families: dict[str, list[str]] = {}  # family name -> its HELP/TYPE lines, then every node's samples
    order: list[str] = []
    for node, answer in ok.items():
        family = None
        for line in answer["text"].splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                parts = line.split()
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    family = parts[2]
                    if family not in families:
                        families[family], order = [], [*order, family]
                    if line not in families[family]:
                        families[family].append(line)
                continue
            if family is None:
                family = "_"
                families.setdefault(family, [])
                order.append(family) if family not in order else None
            families[family].append(_labelled(line, node))
    return {"text": "\n".join(line for name in order for line in families[name]) + "\n"}


def _labelled(sample: str, node: str) -> str:
    label = f'node="{node}"'
    name, brace, rest = sample.partition("{")
    if brace:
        return f"{name}{{{label},{rest}" if not rest.startswith("}") else f"{name}{{{label}{rest}"
    name, _, value = sample.partition(" ")
    return f"{name}{{{label}}} {value}"


async def _reload(client_factory, nodes, deadline) -> dict:
    """One node: the plain reload.  Several: prepare on every node (each checks and holds), then
    commit on every node; a refusal aborts every prepared node and is the answer (with ``details``
    naming the node); a commit that fails after others committed is logged and answered per node."""
    if len(nodes) == 1:
        return await client_factory(nodes[0].channel).call(OP_RELOAD_SETTINGS, {}, deadline=deadline)
    reload_id = uuid.uuid4().hex
    prepared = await _ask(client_factory, nodes, OP_RELOAD_PREPARE, {"reload_id": reload_id}, deadline)
    refused = {name: answer for name, answer in prepared.items() if isinstance(answer, BaseException)}
    if refused:
        await _ask(client_factory, nodes, OP_RELOAD_ABORT, {"reload_id": reload_id}, deadline)
        name, error = next(iter(refused.items()))
        if not isinstance(error, LLMPoolError):
            error = LLMPoolError(str(error))
        refusals = [{"node": n, "code": getattr(e, "code", "internal_error"), "message": getattr(e, "message", str(e)),
                     "details": getattr(e, "details", None)} for n, e in refused.items()]
        answer = type(error)(f"node {name}: {error.message}", param=error.param, details={
            "refused_by": refusals, "problems": error.details})
        answer.code, answer.http_status = error.code, error.http_status
        raise answer
    committed = await _ask(client_factory, nodes, OP_RELOAD_COMMIT, {"reload_id": reload_id}, deadline)
    failed = {n: a for n, a in committed.items() if isinstance(a, BaseException)}
    for name, error in failed.items():
        logger.error("settings reload: node %s failed to commit after the others prepared: %s", name, error)
    merged = {key: sorted({m for a in committed.values() if isinstance(a, dict) for m in a.get(key, [])})
              for key in ("added_models", "removed_models", "updated_models", "unchanged_models")}
    merged["service_restart_required"] = any(
        a.get("service_restart_required") for a in committed.values() if isinstance(a, dict))
    merged["nodes"] = [
        {"node": n, **(_diff_only(a) if isinstance(a, dict) else {"error": _status_error(a)})}
        for n, a in committed.items()
    ]
    return merged


def _diff_only(diff: dict) -> dict:
    return {k: diff[k] for k in ("added_models", "removed_models", "updated_models", "unchanged_models") if k in diff}


def _status_error(error: BaseException) -> dict:
    return {"code": getattr(error, "code", "internal_error"), "message": getattr(error, "message", str(error))}
