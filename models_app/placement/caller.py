"""The thin caller between the API and the transport: place, send, merge (``models_app.placement``)."""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from models_app.placement import decide, several
from models_app.placement.inflight import INFLIGHT, SUSPECTS
from models_app.transport import nodes
from models_app.transport.runtime_client import RuntimeClient, result_of


async def view() -> decide.View:
    """The pool as the registry says now (cached ``nodes.CACHE_SECONDS``) with this process's bookkeeping."""
    known, split = await nodes.REGISTRY.nodes(), nodes.is_split()
    # Embedded, the one node is this process's own (and its name is ``this_node()`` already).
    own = nodes.this_node() if split or not known else known[0].name
    return decide.View(known, split, own, INFLIGHT.counts, SUSPECTS.names())


async def place(op: str, payload: dict) -> decide.Placement:
    current = await view()
    if decide.needs_fresh_view(op, payload, current):
        nodes.REGISTRY.forget_cache()
        current = await view()
    return decide.place(op, payload, current)


async def call(op: str, payload: dict | None = None, *, deadline: float | None = None,
               client: RuntimeClient | None = None, on_cancelled: Callable[[dict], None] | None = None) -> dict:
    """One request, one result (heartbeats keep it alive up to ``deadline`` seconds), from wherever
    ``decide.place`` sends it; a model's AdminModelEntry answered by one node says which (``node``).
    ``on_cancelled``: for a call one node answers, as ``RuntimeClient.exchange`` says."""
    payload = payload or {}
    client = client or RuntimeClient()
    where = await place(op, payload)
    if isinstance(where, decide.Every):
        return await several.call_every(client, op, payload, deadline, where.nodes, where.known)
    if isinstance(where, decide.Spread):
        return await several.call_spread(client, op, payload, deadline, where.nodes)
    result = await result_of(exchange(op, payload, deadline=deadline, client=client, node=where.node,
                                      on_cancelled=on_cancelled))
    if isinstance(result, dict) and "runtime_state" in result and "name" in result:
        result = {**result, "node": where.node.name}
    return result


async def exchange(op: str, payload: dict, *, deadline: float | None = None, client: RuntimeClient | None = None,
                   node: nodes.Node | None = None,
                   on_cancelled: Callable[[dict], None] | None = None) -> AsyncIterator[dict]:
    """The runtime's chunk and result messages for a call that one node serves (``node``, else where
    ``decide.place`` sends it); closing the iterator early (client gone) tells the runtime to cancel
    (``on_cancelled``: as ``RuntimeClient.exchange`` says).

    The call counts in flight (``TRACKED_OPS``) while it lasts; a node that stays silent is
    suspected, so the next requests prefer another node meanwhile."""
    if node is None:
        where = await place(op, payload)
        if not isinstance(where, decide.One):
            raise TypeError(f"{op} is not answered by one node")
        node = where.node
    keys = (INFLIGHT.track(decide.inflight_keys(node, decide.model_of(op, payload), payload.get("fairness_key")))
            if op in decide.TRACKED_OPS else None)
    messages = (client or RuntimeClient()).exchange(node.channel, op, payload, deadline=deadline,
                                                    on_silent=lambda: SUSPECTS.suspect(node.name),
                                                    on_cancelled=on_cancelled)
    try:
        async for message in messages:
            yield message
    finally:
        INFLIGHT.untrack(keys)
        await messages.aclose()

