"""How the API merges the answers of several nodes, and names a node from a host name."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from models_app.placement import caller, decide
from models_app.placement.inflight import INFLIGHT
from models_app.placement.merges import metrics as _metrics
from models_app.transport.messages import OP_GENERATE
from models_app.transport.nodes import Node, node_channel, node_name
from models_app.transport import nodes as pool_nodes

TEXT = """# HELP llmpool_requests_total Requests.
# TYPE llmpool_requests_total counter
llmpool_requests_total{model="m"} 3.0
# HELP llmpool_up Up.
# TYPE llmpool_up gauge
llmpool_up 1.0
"""


async def route(model: str, fairness_key: str | None = None) -> Node:
    """The node a generate request for ``model`` goes to, placed as the API places it."""
    where = await caller.place(OP_GENERATE, {"model": model, "fairness_key": fairness_key})
    assert isinstance(where, decide.One)
    return where.node


def test_every_nodes_samples_get_a_node_label_in_one_family_each():
    merged = _metrics({"alpha": {"text": TEXT}, "beta": {"text": TEXT.replace("3.0", "5.0")}}, {})["text"]
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    requests = {s.labels["node"]: s.value for s in families["llmpool_requests"].samples}
    assert requests == {"alpha": 3.0, "beta": 5.0}
    assert {s.labels["node"] for s in families["llmpool_up"].samples} == {"alpha", "beta"}


def test_a_host_name_becomes_a_channel_safe_node_name():
    assert node_name("gpu-1.example.com") == "gpu-1.example.com"
    assert node_name("my host:8") == "my_host_8"
    assert node_name("_x") == "n_x"
    assert len(node_name("a" * 300)) == 80
    assert node_channel("my host") == "llmpool-runtime.my_host"


def test_routing_prefers_an_alive_node_where_the_model_is_loaded_and_least_busy(monkeypatch, settings):
    settings.REDIS_URL = "redis://unused"

    def node(name, state, load, alive=True):
        return Node(name, node_channel(name), alive, {"models": [{"name": "m", "aliases": ["m2"],
                                                                  "runtime_state": state, "load": load}]})

    async def nodes():
        return listed

    monkeypatch.setattr(pool_nodes.REGISTRY, "nodes", nodes)
    import asyncio

    listed = [node("a", "unloaded", 0), node("b", "loaded", 4), node("c", "loaded", 1), node("d", "loaded", 0, False)]
    assert asyncio.run(route("m2")).name == "c"
    listed = [node("d", "loaded", 0, False)]
    try:
        asyncio.run(route("m"))
    except Exception as exc:
        assert getattr(exc, "code", None) == "runtime_unavailable" and "d" in str(exc)
    else:
        raise AssertionError("a model served only by a down node must be 503")


def test_the_api_resolves_a_models_names_over_every_nodes_record(monkeypatch, settings):
    """The edge's key check and routing resolve a name by the same rule as the runtime, over the
    records of every node, a down one's too."""
    import asyncio

    settings.REDIS_URL = "redis://unused"
    listed = [Node("a", node_channel("a"), True, {"models": [{"name": "m", "aliases": ["m2"]}]}),
              Node("b", node_channel("b"), False, {"models": [{"name": "n", "aliases": ["n2", "n3"]}, {"name": "m"}]})]

    async def nodes():
        return listed

    monkeypatch.setattr(pool_nodes.REGISTRY, "nodes", nodes)
    names = asyncio.run(pool_nodes.REGISTRY.model_names())
    assert names == {"m": "m", "m2": "m", "n": "n", "n2": "n", "n3": "n"}
    assert [n.serves("m2") for n in listed] == [True, False]
    assert listed[1].model("n3") == {"name": "n", "aliases": ["n2", "n3"]}
    assert listed[0].model("n3") is None


def test_the_embedded_node_is_the_record_its_runtime_announced(settings):
    import asyncio

    settings.REDIS_URL = ""
    registry = pool_nodes.Registry()
    assert asyncio.run(registry.model_names()) == {}  # no runtime in this process yet
    registry.announce_here({"models": [{"name": "m", "aliases": ["m2"]}]})
    assert asyncio.run(registry.model_names()) == {"m": "m", "m2": "m"}
    registry.announce_here(None)
    assert asyncio.run(registry.model_names()) == {}


def test_a_model_missing_from_the_cached_view_is_looked_up_again(monkeypatch, settings):
    import asyncio

    settings.REDIS_URL = "redis://unused"
    registry = pool_nodes.Registry()
    monkeypatch.setattr(pool_nodes, "REGISTRY", registry)
    before = [Node("a", node_channel("a"), True, {"models": [{"name": "old", "runtime_state": "loaded"}]})]
    after = [*before, Node("b", node_channel("b"), True, {"models": [{"name": "new", "runtime_state": "loaded"}]})]
    reads = iter([before, after])

    async def read():
        return next(reads)

    monkeypatch.setattr(registry, "_read", read)

    async def scenario():
        assert (await route("old")).name == "a"  # the first read, cached now
        return (await route("new")).name  # not in the cached view: read again

    assert asyncio.run(scenario()) == "b"


def test_routing_spreads_each_fairness_key_evenly_over_the_nodes(monkeypatch, settings):
    """A key's own requests in flight decide first, then all of them: without it, a key could pile
    up on one node and each node's fair order would no longer add up to a fair one (the per-node
    VTC serves every key alike on each node, so a key twice as present on one node ends later)."""
    import asyncio

    settings.REDIS_URL = "redis://unused"
    listed = [Node(name, node_channel(name), True, {"models": [{"name": "m", "runtime_state": "loaded", "load": 0}]})
              for name in ("a", "b")]

    async def nodes():
        return listed

    monkeypatch.setattr(pool_nodes.REGISTRY, "nodes", nodes)
    a, b = listed
    held = [INFLIGHT.track(decide.inflight_keys(a, "m", "heavy")), INFLIGHT.track(decide.inflight_keys(a, "m", "heavy")),
            *(INFLIGHT.track(decide.inflight_keys(b, "m", "other")) for _ in range(3))]
    try:
        # a has 2 in flight, b 3: by the totals alone "heavy" would go to a again.
        assert asyncio.run(route("m", "heavy")).name == "b"
        assert asyncio.run(route("m", "light")).name == "a"  # a key with none anywhere: the totals
    finally:
        for keys in held:
            INFLIGHT.untrack(keys)
    assert INFLIGHT.counts == {}


def test_a_node_down_in_the_cached_view_is_looked_up_again_before_a_503(monkeypatch, settings):
    import asyncio

    settings.REDIS_URL = "redis://unused"
    registry = pool_nodes.Registry()
    monkeypatch.setattr(pool_nodes, "REGISTRY", registry)
    served = {"models": [{"name": "m", "runtime_state": "loaded"}]}
    # A restarted worker: down in the view the API cached, announced again since.
    reads = iter([[Node("a", node_channel("a"), False, served)], [Node("a", node_channel("a"), True, served)]])

    async def read():
        return next(reads)

    monkeypatch.setattr(registry, "_read", read)

    async def scenario():
        await registry.nodes()  # the cached view: "a" down
        return (await route("m")).name

    assert asyncio.run(scenario()) == "a"
