"""The merges of answers that several nodes gave to one call: plain data in, one answer out.

Each takes ``ok``, node name -> that node's answer, in the order the nodes were asked (docs/api.md):

- ``list_models``: every node's entries, each with its ``node``;
- ``gpu_memory``: every node's gpus, models and devices (each with ``node``), and per node its own;
- ``catalog``: the models of every node (a model two nodes serve once);
- ``activity``: the requests of every node, newest first (``limit`` applied after the merge);
- ``metrics``: every node's samples with a ``node`` label, one family after another;
- a spread admin call (``combined``): the first node's entry with the totals over the nodes;
- a two-phase settings reload (``reload_diffs``): the union of the diffs.
"""
from __future__ import annotations

from models_app.transport.messages import OP_ACTIVITY, OP_CATALOG, OP_GPU_MEMORY, OP_LIST_MODELS, OP_METRICS
from runtime.errors import LLMPoolError

TOTALS = ("replicas", "loaded_replicas", "inflight_requests", "queue_depth")
DIFF_KEYS = ("added_models", "removed_models", "updated_models", "unchanged_models")


def with_node(item, node: str):
    return {**item, "node": node} if isinstance(item, dict) else item


def models(ok: dict, payload: dict) -> dict:
    """Every AdminModelEntry says its node, with one node or several."""
    return {"models": [with_node(entry, node) for node, answer in ok.items() for entry in answer["models"]]}


def gpu_memory(ok: dict, payload: dict) -> dict:
    merged = {"gpus": [], "models": [], "error": None, "devices": [], "per_node": {}}
    for node, answer in ok.items():
        for key in ("gpus", "models", "devices"):
            merged[key] += [with_node(item, node) for item in answer.get(key) or []]
        merged["error"] = merged["error"] or answer.get("error")
        merged["per_node"][node] = {"gpus": answer.get("gpus") or [], "devices": answer.get("devices") or [],
                                    "gpu_error": answer.get("error")}
    return merged


def catalog(ok: dict, payload: dict) -> dict:
    entries, seen, configured = [], set(), set()
    for node, answer in ok.items():
        configured.update(answer.get("configured_models") or ())
        for model in answer["models"]:
            if model["name"] not in seen:
                seen.add(model["name"])
                entries.append(model)
    first = next(iter(ok.values()))
    return {"models": entries, "service": first.get("service"), "configured_models": sorted(configured | seen)}


def activity(ok: dict, payload: dict) -> dict:
    requests = [with_node(item, node) for node, answer in ok.items() for item in answer["requests"]]
    requests.sort(key=lambda r: r.get("at") or "", reverse=True)
    first = next(iter(ok.values()))
    limit = payload.get("limit")
    size = first.get("size")
    return {"requests": requests[: int(limit)] if limit else requests[:size] if size else requests,
            "size": size, "capture_requests": first.get("capture_requests")}


def metrics(ok: dict, payload: dict) -> dict:
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
            families[family].append(labelled(line, node))
    return {"text": "\n".join(line for name in order for line in families[name]) + "\n"}


def labelled(sample: str, node: str) -> str:
    label = f'node="{node}"'
    name, brace, rest = sample.partition("{")
    if brace:
        return f"{name}{{{label},{rest}" if not rest.startswith("}") else f"{name}{{{label}{rest}"
    name, _, value = sample.partition(" ")
    return f"{name}{{{label}}} {value}"


MERGES = {OP_LIST_MODELS: models, OP_GPU_MEMORY: gpu_memory, OP_CATALOG: catalog, OP_ACTIVITY: activity,
          OP_METRICS: metrics}


def status(node: str, answer) -> dict:
    """One node's line in a merged answer's ``nodes``: alive, or its error."""
    line = {"node": node, "alive": not isinstance(answer, BaseException)}
    if isinstance(answer, LLMPoolError):
        line["error"] = {"code": answer.code, "message": answer.message}
    elif isinstance(answer, BaseException):
        line["error"] = {"code": "internal_error", "message": str(answer)}
    return line


def shares(replicas: int, count: int) -> list[int]:
    """``replicas`` over ``count`` nodes in order, the first ones one more; zeros left out."""
    base, extra = divmod(replicas, count)
    return [k for k in (base + (1 if i < extra else 0) for i in range(count)) if k > 0]


def combined(answers: dict[str, dict]) -> dict:
    """A spread call's answer: the first node's entry (with its ``node``), the ``TOTALS`` summed where
    every node gave a number, and ``nodes``: each node's state and replicas."""
    first_node, first = next(iter(answers.items()))
    merged = {**first, "node": first_node}
    entries = {n: a for n, a in answers.items() if isinstance(a, dict) and "runtime_state" in a}
    for key in TOTALS:
        if all(isinstance(a.get(key), int) for a in entries.values()):
            merged[key] = sum(a[key] for a in entries.values())
    merged["nodes"] = [
        {"node": n, "runtime_state": a["runtime_state"], "replicas": a.get("replicas"),
         "loaded_replicas": a.get("loaded_replicas")}
        for n, a in entries.items()
    ]
    return merged


def reload_diffs(committed: dict) -> dict:
    """The nodes' commits of one two-phase reload (a diff, or the error of a node that failed)."""
    merged = {key: sorted({m for a in committed.values() if isinstance(a, dict) for m in a.get(key, [])})
              for key in DIFF_KEYS}
    merged["service_restart_required"] = any(
        a.get("service_restart_required") for a in committed.values() if isinstance(a, dict))
    merged["nodes"] = [
        {"node": n, **({k: a[k] for k in DIFF_KEYS if k in a} if isinstance(a, dict) else {"error": _error(a)})}
        for n, a in committed.items()
    ]
    return merged


def _error(error: BaseException) -> dict:
    return {"code": getattr(error, "code", "internal_error"), "message": getattr(error, "message", str(error))}
