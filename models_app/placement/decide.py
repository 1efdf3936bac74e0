"""Where one runtime call goes: a pure function of the call and a view of the pool's nodes.

``place(op, payload, view)`` answers one of three: ``One`` node (a call that names a model, or an
unrouted one), ``Every`` alive node (a call about the whole pool, its answers merged by
``models_app.placement.merges``), or ``Spread`` over the alive nodes that serve a model (an admin
call on a model whose replicas several nodes hold).  It reads nothing but its arguments: the nodes as
the registry last said (``models_app.transport.nodes``), and this process's own bookkeeping as plain
data (``models_app.placement.inflight``).

A model's name (or an alias) is resolved by ``Node.serves``/``Node.model``, that is by
``runtime.pool.catalog.canonical_model``, the one rule keys and the runtime use too.

A generation whose model several nodes serve goes to its conversation's node (``affine``): the
turns of one conversation go where the engine's KV cache holds its earlier turns, as the runtime's
replica routing keeps them on one replica (runtime.model.routing).  The node is the conversation's
in rendezvous hashing (highest random weight) over the nodes that serve the model, the same in
every API process without any shared state, and only the conversations of a node that leaves or
joins move; it is taken while its load, and the request's fairness key's own load there, stay
within the bound of consistent hashing with bounded loads, else the next in the conversation's
order, else the least loaded.  The key's bound keeps every key spread over the nodes, which the
per-node fair orders need to add up to a fair one (docs/scheduling.md): a conversation's first
turn, which no cache holds yet, goes home only within the key's even share of the nodes; a later
turn, whose earlier turns are cached there, within ``AFFINITY_LOAD_FACTOR`` times it.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from models_app.transport.messages import (
    OP_ACTIVITY,
    OP_CATALOG,
    OP_EMBED,
    OP_GENERATE,
    OP_GPU_MEMORY,
    OP_LIST_MODELS,
    OP_LOAD,
    OP_METRICS,
    OP_RECONFIGURE,
    OP_RELOAD_SETTINGS,
    OP_RERANK,
    OP_SLEEP,
    OP_TRANSCRIBE,
    OP_UNLOAD,
    OP_WAKE,
)
from models_app.transport.nodes import EXPIRY_SECONDS, Node, node_channel
from runtime.errors import RuntimeUnavailable
from runtime.inference.prefix_marks import conversation_mark
from runtime.inputs.request import GenerationRequest

POOL_OPS = frozenset({OP_LIST_MODELS, OP_GPU_MEMORY, OP_CATALOG, OP_METRICS, OP_RELOAD_SETTINGS, OP_ACTIVITY})
SPREAD_OPS = frozenset({OP_LOAD, OP_UNLOAD, OP_RECONFIGURE, OP_SLEEP, OP_WAKE})
# The ops whose requests in flight routing counts (its least-loaded pick).
TRACKED_OPS = frozenset({OP_GENERATE, OP_EMBED, OP_TRANSCRIBE, OP_RERANK})
# A conversation's node is kept while its load stays within this times the average (the bound of
# consistent hashing with bounded loads; the runtime's replica routing uses the same default).
AFFINITY_LOAD_FACTOR = 1.25


@dataclass(slots=True)
class View:
    """What placement knows: the pool's nodes sorted by name, whether the pool is split (several
    processes over Redis) or embedded, this process's node name, its requests in flight
    (``Inflight.counts``) and the nodes it suspects (left a call unanswered a moment ago)."""

    nodes: list[Node]
    split: bool
    own: str
    inflight: Mapping[tuple, int] = field(default_factory=dict)
    suspected: frozenset[str] = frozenset()


@dataclass(slots=True)
class One:
    node: Node


@dataclass(slots=True)
class Every:
    nodes: list[Node]  # the nodes asked
    known: list[Node]  # every node the registry knows (the merged answer lists the down ones too)


@dataclass(slots=True)
class Spread:
    nodes: list[Node]


Placement = One | Every | Spread


def model_of(op: str, payload: dict) -> str | None:
    """The model a request names: ``model`` for inference (and activity), ``name`` for admin calls."""
    if op in TRACKED_OPS:
        return payload.get("model")
    return payload.get("name") or payload.get("model")


def is_pool_call(op: str, payload: dict) -> bool:
    """Whether ``op`` goes to every node (activity only without a model: with one, to its node)."""
    return op in POOL_OPS and not (op == OP_ACTIVITY and payload.get("model"))


def place(op: str, payload: dict, view: View) -> Placement:
    """Where ``op`` with ``payload`` goes; raises RuntimeUnavailable where nowhere can answer it."""
    if is_pool_call(op, payload):
        return Every(targets(view), view.nodes)
    model = model_of(op, payload)
    if op in SPREAD_OPS:
        several = serving(model, view)
        if len(several) > 1:
            return Spread(several)
    return One(route(model, payload.get("fairness_key"), view, payload if op == OP_GENERATE else None))


def needs_fresh_view(op: str, payload: dict, view: View) -> bool:
    """Whether the view is worth reading again before placing: the call names a model no alive node
    of it serves (perhaps added by a reload, or its node back, since the view was read; a restarted
    worker answers as soon as it has announced itself, not a cache period later)."""
    if is_pool_call(op, payload) or (len(view.nodes) == 1 and not view.split):
        return False
    model = model_of(op, payload)
    return model is not None and not any(n.alive and n.serves(model) for n in view.nodes)


def serving(model: str | None, view: View) -> list[Node]:
    """The alive nodes that serve ``model``, by name (a spread call needs two or more; split only)."""
    if model is None or not view.split:
        return []
    return [n for n in view.nodes if n.alive and n.serves(model)]


def route(model: str | None, fairness_key: str | None, view: View, generation: dict | None = None) -> Node:
    """The node a request for ``model`` (a name or an alias) goes to.

    Among the alive nodes that serve it: the least loaded (``load_key``), or for a ``generation``
    (its wire payload) its conversation's node among those as good in all but load (``affine``).
    Served only by nodes that are down: RuntimeUnavailable.  Served by no node the view knows: the
    first alive node (it answers 404 unknown_model), or, with none alive yet, this process's own
    node's channel (the request waits there for a runtime that starts, as on a single node).
    """
    nodes = view.nodes
    if len(nodes) == 1 and not view.split:
        return nodes[0]
    serving_nodes = [n for n in nodes if model is not None and n.serves(model)]
    alive = [n for n in serving_nodes if n.alive]
    if alive:
        best = min(alive, key=lambda n: load_key(n, model, fairness_key, view))
        if generation is not None and "request_id" in generation and len(alive) > 1:  # a whole request's wire
            return affine(alive, best, GenerationRequest.from_wire(generation), model, fairness_key, view)
        return best
    if serving_nodes:
        down = ", ".join(n.name for n in serving_nodes)
        raise RuntimeUnavailable(
            f"model {model!r} is served by node {down}, which is down (no heartbeat within {EXPIRY_SECONDS:g} s)"
        )
    up = [n for n in nodes if n.alive]
    if up:
        return up[0]
    return _own(view)


def affine(alive: list[Node], best: Node, request: GenerationRequest, model: str, fairness_key: str | None,
           view: View) -> Node:
    """``request``'s conversation's node (the module docstring) among ``alive``, those not
    suspected and loaded as ``best`` is: the first in the conversation's rendezvous order where
    the model's load and the fairness key's own requests (per loaded replica), this one counted,
    each stay within ``ceil(factor * (their sum over those nodes + 1) / their number)``, the factor
    ``AFFINITY_LOAD_FACTOR`` but for the key's requests of a first turn (1: its even share);
    ``best`` where the request has no conversation to mark or no node is within both."""
    conversation = conversation_mark(request)
    if conversation is None:
        return best
    mark, continues = conversation
    # load_key's figures: (suspected, not loaded, the key's requests, all requests, the heartbeat
    # load, each per loaded replica, the name); peers are as good as ``best`` in all but load.
    figures = {n.name: load_key(n, model, fairness_key, view) for n in alive}
    tier = figures[best.name][:2]
    peers = [n for n in alive if figures[n.name][:2] == tier]
    # The model's load: this process's own requests in flight (exact) or the heartbeat's figure
    # (every API process's, up to about 1.5 s old), the larger; and the key's own.
    loads = {n.name: max(figures[n.name][3:5]) for n in peers}
    of_key = {n.name: figures[n.name][2] for n in peers}
    bound = math.ceil(AFFINITY_LOAD_FACTOR * (sum(loads.values()) + 1) / len(peers))
    key_bound = math.ceil((AFFINITY_LOAD_FACTOR if continues else 1.0) * (sum(of_key.values()) + 1) / len(peers))
    name = mark.to_bytes(8, "little")
    for candidate in sorted(peers, key=lambda n: hashlib.blake2b(name + n.name.encode(), digest_size=8).digest(),
                            reverse=True):
        if loads[candidate.name] + 1 <= bound and of_key[candidate.name] + 1 <= key_bound:
            return candidate
    return best


def targets(view: View) -> list[Node]:
    """The nodes a pool call asks: the alive ones; none alive, this process's own node's channel
    (which answers 503 runtime_unavailable within the reply timeout if no runtime starts there)."""
    alive = [n for n in view.nodes if n.alive]
    if alive:
        return alive
    if view.split and view.nodes and view.own not in {n.name for n in view.nodes}:
        down = ", ".join(n.name for n in view.nodes)
        raise RuntimeUnavailable(f"no node of the pool is alive (known: {down})")
    return [_own(view)]


def _own(view: View) -> Node:
    return next((n for n in view.nodes if n.name == view.own), Node(view.own, node_channel(view.own), False))


def inflight_keys(node: Node, model: str | None, fairness_key: str | None) -> tuple[tuple, tuple]:
    """The two counters one request of ``model`` (a name or an alias) on ``node`` counts in:
    (node, model) and (node, model, fairness key), the model by its own name where ``node`` serves it."""
    entry = node.model(model) if model is not None else None
    where = (node.name, entry["name"] if entry else model or "")
    return where, (*where, fairness_key)


def load_key(node: Node, model: str, fairness_key: str | None, view: View) -> tuple:
    """Not suspected first, then loaded; then the fewest requests per loaded replica: this process's
    own of the request's fairness key in flight there, then all its own there (both exact, at once),
    then the node's last heartbeat figure (every API process's, up to about 1.5 s old); then the name.
    The key's own count first spreads every key evenly over the nodes, so each node's fair order adds
    up to a fair order over all of them (docs/scheduling.md)."""
    entry = node.model(model) or {}
    loaded = entry.get("runtime_state") == "loaded"
    replicas = max(1, entry.get("replicas") or 1)
    where = (node.name, entry.get("name", model))
    mine_of_key = view.inflight.get((*where, fairness_key), 0)
    mine = view.inflight.get(where, 0)
    return (node.name in view.suspected, not loaded, mine_of_key / replicas, mine / replicas,
            entry.get("load", 0) / replicas, node.name)
