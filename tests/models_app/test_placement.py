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


# ---- a conversation's node ------------------------------------------------------------------------


def turns(conversation: int, count: int, system: str | None = "You are terse.") -> list[dict]:
    """The wire payloads of ``count`` turns of one conversation, each repeating the earlier ones."""
    messages = [{"role": "system", "content": [{"type": "input_text", "text": system}]}] if system else []
    payloads = []
    for turn in range(count):
        messages = [*messages, {"role": "user", "content": [{"type": "input_text", "text": f"c{conversation} t{turn}"}]}]
        payloads.append({"model": "m", "request_id": f"r{turn}", "messages": messages})
        messages = [*messages, {"role": "assistant", "content": [{"type": "output_text", "text": f"answer {turn}"}]}]
    return payloads


def placed(payload: dict, view: View) -> str:
    return place(OP_GENERATE, payload, view).node.name


def test_every_turn_of_a_conversation_goes_to_one_node_and_conversations_spread():
    view = split(node("a", model()), node("b", model()), node("c", model()))
    homes = []
    for conversation in range(24):
        for system in ("You are terse.", None):  # with a system part, and without (its first message names it)
            [first, *later] = [placed(p, view) for p in turns(conversation, 4, system)]
            assert later == [first] * 3
            homes.append(first)
    assert set(homes) == {"a", "b", "c"}  # the agent's shared system part does not send them all to one node


def test_a_conversations_node_is_the_same_in_every_api_process_and_moves_only_when_its_node_leaves():
    nodes = [node(name, model()) for name in "abc"]
    payloads = [turns(conversation, 1)[0] for conversation in range(30)]
    before = [placed(p, split(*nodes, own="api-1")) for p in payloads]
    assert [placed(p, split(*nodes, own="api-2")) for p in payloads] == before
    after = [placed(p, split(*nodes[:2])) for p in payloads]
    assert all(b == a for a, b in zip(before, after) if a != "c")  # only c's conversations moved
    assert "c" in before


def test_a_conversations_node_over_the_load_bound_gives_way():
    payload = turns(7, 1)[0]
    home = placed(payload, split(node("a", model()), node("b", model())))
    other = "b" if home == "a" else "a"
    # 3 requests on its node, 0 on the other: ceil(1.25 * 4 / 2) = 3 < 4 with this one.
    view = split(node(home, model(load=3)), node(other, model(load=0)))
    assert placed(payload, view) == other
    # 2 there, 1 on the other: 2 + 1 <= ceil(1.25 * 4 / 2) = 3, so it stays home.
    view = split(node(home, model(load=2)), node(other, model(load=1)))
    assert placed(payload, view) == home


def test_a_conversation_never_goes_to_an_unloaded_or_suspected_node_for_its_cache():
    payload = turns(3, 1)[0]
    home = placed(payload, split(node("a", model()), node("b", model())))
    other = "b" if home == "a" else "a"
    assert placed(payload, split(node(home, model(state="unloaded")), node(other, model(load=5)))) == other
    assert placed(payload, split(node(home, model()), node(other, model(load=5)), suspected={home})) == other


def test_requests_with_nothing_to_mark_and_other_calls_go_to_the_least_loaded_node():
    view = split(node("a", model(load=2)), node("b", model(load=0)))
    assert placed({"model": "m", "request_id": "r", "messages": []}, view) == "b"
    assert place(OP_EMBED, {"model": "m", "input": ["x"]}, view).node.name == "b"


def test_a_conversation_gives_way_where_its_fairness_key_is_over_its_share_of_the_nodes():
    """The key's own requests in flight are bounded as the node's are: a key whose conversations all
    live on one node still spreads over the nodes (its fair order there adds up to a fair one)."""
    payload = {**turns(5, 1)[0], "fairness_key": "heavy"}
    home = placed(payload, split(node("a", model()), node("b", model())))
    other = "b" if home == "a" else "a"
    a, b = node(home, model()), node(other, model())
    inflight = Inflight()
    for _ in range(3):  # 3 of the key's requests at home, none elsewhere: ceil(1.25 * 4 / 2) = 3 < 4
        inflight.track(inflight_keys(a, "m", "heavy"))
    assert placed(payload, split(a, b, inflight=inflight.counts)) == other
    assert placed({**payload, "fairness_key": "light"}, split(a, b, inflight=inflight.counts)) == other  # a's load: 3
    inflight.track(inflight_keys(b, "m", "other"))
    inflight.track(inflight_keys(b, "m", "other"))
    # a 3, b 2 in all: 3 + 1 <= ceil(1.25 * 6 / 2) = 4; "light" has none anywhere: it goes home
    assert placed({**payload, "fairness_key": "light"}, split(a, b, inflight=inflight.counts)) == home


def test_a_first_turn_keeps_to_its_keys_even_share_and_a_later_turn_to_the_bound():
    """A first turn has no cache to find: it goes home only within its key's even share, so each
    key's conversations start spread evenly; a later turn's cache is worth up to 1.25 times it."""
    first, _, third = ({**payload, "fairness_key": "k"} for payload in turns(9, 3))
    home = placed(first, split(node("a", model()), node("b", model())))
    other = "b" if home == "a" else "a"
    a, b = node(home, model()), node(other, model())
    inflight = Inflight()
    for where in (a, a, b):  # the key: 2 at home, 1 elsewhere
        inflight.track(inflight_keys(where, "m", "k"))
    view = split(a, b, inflight=inflight.counts)
    assert placed(first, view) == other  # 2 + 1 > ceil(4 / 2)
    assert placed(third, view) == home  # 2 + 1 <= ceil(1.25 * 4 / 2)


def test_a_fixed_opening_before_the_first_user_message_does_not_name_the_conversation():
    """An app whose every conversation opens with the same assistant greeting: the user's first
    message names each one, so they spread over the nodes, and each keeps its node."""
    greeting = {"role": "assistant", "content": [{"type": "output_text", "text": "Hello! How can I help?"}]}
    view = split(node("a", model()), node("b", model()), node("c", model()))
    homes = set()
    for conversation in range(12):
        first, *later = ({**p, "messages": [greeting, *p["messages"]]} for p in turns(conversation, 3, system=None))
        homes.add(placed(first, view))
        assert {placed(p, view) for p in later} == {placed(first, view)}
    assert homes == {"a", "b", "c"}


def test_a_raw_prompt_keeps_its_node_once_it_fills_a_block_and_goes_by_load_before():
    from runtime.inference.prefix_marks import RAW_BLOCK_CHARS

    short = {"model": "m", "request_id": "r", "messages": [], "prompt": "Once upon a time"}
    loaded = split(node("a", model(load=1)), node("b", model(load=0)))
    # Under a block: nothing that stays the same as the prompt grows, so the least loaded node
    # (a, 1 + 1 within its bound of 2, would be kept for a conversation homed there).
    assert {placed({**short, "prompt": f"Story {n}: once upon a time"}, loaded) for n in range(12)} == {"b"}
    view = split(node("a", model()), node("b", model()), node("c", model()))
    text = "x" * RAW_BLOCK_CHARS
    assert {placed({**short, "prompt": text + more}, view) for more in ("", " and on", " and on and on")} \
        == {placed({**short, "prompt": text}, view)}
