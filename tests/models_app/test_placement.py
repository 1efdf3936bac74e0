"""Placement as a pure function of plain data: which node, every node, or a spread, and the merges."""
from __future__ import annotations

import pytest

from models_app.placement import merges
from models_app.placement.decide import (
    Every,
    One,
    Spread,
    View,
    inflight_keys,
    needs_fresh_view,
    place,
)
from models_app.placement.inflight import Inflight, Suspects
from models_app.transport.messages import (
    OP_ACTIVITY,
    OP_EMBED,
    OP_GENERATE,
    OP_GET_MODEL,
    OP_LIST_MODELS,
    OP_LOAD,
    OP_METRICS,
    OP_UNLOAD,
)
from models_app.transport.nodes import Node, node_channel
from runtime.errors import LLMPoolError, RuntimeUnavailable


def node(name: str, *models: dict, alive: bool = True) -> Node:
    return Node(name, node_channel(name), alive, {"models": list(models)})


def model(name: str = "m", state: str = "loaded", load: int = 0, replicas: int = 1, aliases=()) -> dict:
    return {"name": name, "aliases": list(aliases), "runtime_state": state, "load": load, "replicas": replicas}


def split(*nodes: Node, inflight=None, suspected=frozenset(), own: str = "here") -> View:
    return View(list(nodes), True, own, inflight or {}, frozenset(suspected))


def test_a_model_on_one_node_goes_there_by_its_name_or_an_alias():
    view = split(node("a", model("other")), node("b", model("m", aliases=["mini"])))
    assert place(OP_GENERATE, {"model": "m"}, view) == One(view.nodes[1])
    assert place(OP_GENERATE, {"model": "mini"}, view) == One(view.nodes[1])
    assert place(OP_GET_MODEL, {"name": "mini"}, view) == One(view.nodes[1])


def test_a_model_on_two_nodes_goes_to_the_loaded_then_least_loaded_one():
    a, b, c = node("a", model(state="unloaded")), node("b", model(load=4)), node("c", model(load=1))
    assert place(OP_GENERATE, {"model": "m"}, split(a, b, c)).node is c
    # Per loaded replica: 4 over 4 replicas is less than 1 over 1.
    b4 = node("b", model(load=4, replicas=4))
    assert place(OP_GENERATE, {"model": "m"}, split(a, b4, c)).node is b4


def test_this_processs_own_requests_in_flight_decide_before_the_heartbeat_load():
    a, b = node("a", model(load=0)), node("b", model(load=9))
    inflight = Inflight()
    for _ in range(2):
        inflight.track(inflight_keys(a, "m", "k"))
    assert place(OP_GENERATE, {"model": "m", "fairness_key": "k"}, split(a, b, inflight=inflight.counts)).node is b
    inflight.track(inflight_keys(b, "m", "other"))
    inflight.track(inflight_keys(b, "m", "other"))
    inflight.track(inflight_keys(b, "m", "other"))
    # A key with none in flight anywhere: the totals (a 2, b 3).
    assert place(OP_GENERATE, {"model": "m", "fairness_key": "new"}, split(a, b, inflight=inflight.counts)).node is a


def test_a_suspected_node_is_avoided_while_another_serves_the_model():
    a, b = node("a", model()), node("b", model(load=5))
    assert place(OP_EMBED, {"model": "m"}, split(a, b, suspected={"a"})).node is b


def test_a_model_served_only_by_a_down_node_is_unavailable():
    view = split(node("a", model(), alive=False), node("b", model("other")))
    assert needs_fresh_view(OP_GENERATE, {"model": "m"}, view)
    with pytest.raises(RuntimeUnavailable, match="served by node a, which is down"):
        place(OP_GENERATE, {"model": "m"}, view)


def test_an_unknown_model_goes_to_the_first_alive_node_or_this_processs_own():
    view = split(node("a", model(), alive=False), node("b", model("x")), node("c", model("y")))
    assert place(OP_GENERATE, {"model": "nope"}, view).node.name == "b"
    none_alive = split(node("a", model(), alive=False))
    where = place(OP_GENERATE, {"model": "nope"}, none_alive)
    assert (where.node.name, where.node.channel, where.node.alive) == ("here", node_channel("here"), False)


def test_embedded_one_node_serves_everything_without_a_second_look():
    only = Node("host", "llmpool-runtime", True)
    view = View([only], False, "host")
    assert place(OP_GENERATE, {"model": "anything"}, view) == One(only)
    assert not needs_fresh_view(OP_GENERATE, {"model": "anything"}, view)
    assert place(OP_LOAD, {"name": "anything"}, view) == One(only)  # no spread without a split pool


def test_pool_calls_go_to_every_alive_node():
    a, b, down = node("a"), node("b"), node("c", alive=False)
    view = split(a, b, down)
    assert place(OP_LIST_MODELS, {}, view) == Every([a, b], [a, b, down])
    assert place(OP_METRICS, {}, view) == Every([a, b], [a, b, down])
    assert place(OP_ACTIVITY, {}, view) == Every([a, b], [a, b, down])
    assert isinstance(place(OP_ACTIVITY, {"model": "m"}, split(node("a", model()))), One)  # one model: its node


def test_a_pool_call_with_no_node_alive_is_unavailable_unless_this_node_is_known():
    with pytest.raises(RuntimeUnavailable, match="no node of the pool is alive"):
        place(OP_LIST_MODELS, {}, split(node("a", alive=False)))
    own = node("here", alive=False)
    assert place(OP_LIST_MODELS, {}, split(node("a", alive=False), own)) == Every([own], [node("a", alive=False), own])


def test_an_admin_call_on_a_model_two_alive_nodes_serve_is_spread():
    a, b, c = node("a", model()), node("b", model()), node("c", model(), alive=False)
    assert place(OP_LOAD, {"name": "m"}, split(a, b, c)) == Spread([a, b])
    assert place(OP_UNLOAD, {"name": "m"}, split(a, c)) == One(a)
    assert isinstance(place(OP_GET_MODEL, {"name": "m"}, split(a, b)), One)  # not a spread op


def test_suspects_expire():
    suspects = Suspects()
    suspects.suspect("a", now=100.0)
    assert suspects.names(now=101.0) == {"a"}
    assert suspects.names(now=1000.0) == frozenset()
    assert suspects.until == {}


def test_untrack_ends_what_track_counted():
    inflight = Inflight()
    keys = inflight.track(inflight_keys(node("a", model(aliases=["mini"])), "mini", "k"))
    assert keys == (("a", "m"), ("a", "m", "k"))  # the model by its own name, not the alias
    inflight.untrack(keys)
    inflight.untrack(None)
    assert inflight.counts == {}


# ---- merges --------------------------------------------------------------------------------------


def test_model_lists_say_each_entrys_node():
    merged = merges.models({"a": {"models": [{"name": "m"}]}, "b": {"models": [{"name": "n"}]}}, {})
    assert merged == {"models": [{"name": "m", "node": "a"}, {"name": "n", "node": "b"}]}


def test_a_catalog_lists_a_model_two_nodes_serve_once():
    merged = merges.catalog({"a": {"models": [{"name": "m"}], "configured_models": ["x"], "service": {"s": 1}},
                             "b": {"models": [{"name": "m"}, {"name": "n"}]}}, {})
    assert merged == {"models": [{"name": "m"}, {"name": "n"}], "service": {"s": 1},
                      "configured_models": ["m", "n", "x"]}


def test_activity_is_newest_first_over_the_nodes_and_limited_after_the_merge():
    ok = {"a": {"requests": [{"at": "1"}, {"at": "3"}], "size": 10, "capture_requests": False},
          "b": {"requests": [{"at": "2"}]}}
    merged = merges.activity(ok, {"limit": 2})
    assert merged["requests"] == [{"at": "3", "node": "a"}, {"at": "2", "node": "b"}]
    assert merged["size"] == 10


def test_gpu_memory_keeps_each_nodes_part():
    merged = merges.gpu_memory({"a": {"gpus": [{"i": 0}], "models": [], "error": None},
                                "b": {"gpus": [], "error": "no gpu"}}, {})
    assert merged["gpus"] == [{"i": 0, "node": "a"}]
    assert merged["error"] == "no gpu"
    assert merged["per_node"]["b"] == {"gpus": [], "devices": [], "gpu_error": "no gpu"}


def test_a_spread_answer_sums_the_totals_and_lists_each_node():
    answers = {"a": {"name": "m", "runtime_state": "loaded", "replicas": 2, "loaded_replicas": 2, "queue_depth": 1},
               "b": {"name": "m", "runtime_state": "loaded", "replicas": 1, "loaded_replicas": 1, "queue_depth": 0}}
    merged = merges.combined(answers)
    assert (merged["node"], merged["replicas"], merged["loaded_replicas"], merged["queue_depth"]) == ("a", 3, 3, 1)
    assert [n["node"] for n in merged["nodes"]] == ["a", "b"]
    assert merges.shares(3, 2) == [2, 1] and merges.shares(1, 2) == [1]


def test_a_reload_over_nodes_unites_the_diffs_and_names_a_node_that_failed():
    committed = {"a": {"added_models": ["x"], "removed_models": [], "service_restart_required": False},
                 "b": LLMPoolError("disk full")}
    merged = merges.reload_diffs(committed)
    assert merged["added_models"] == ["x"] and merged["service_restart_required"] is False
    assert merged["nodes"][1] == {"node": "b", "error": {"code": "internal_error", "message": "disk full"}}


def test_a_node_line_says_its_error():
    assert merges.status("a", {"models": []}) == {"node": "a", "alive": True}
    assert merges.status("b", RuntimeUnavailable("silent"))["error"]["code"] == "runtime_unavailable"
