"""The scheduler's decisions, driven synchronously with a fake effects object."""
import pytest

from runtime.config import FairnessSettings
from runtime.errors import ExecutorQueueFull, FairnessKeyQueueFull, ModelUnloading
from runtime.model.scheduler import Scheduler
from runtime.model.tickets import Ticket
from tests.runtime.scheduler_fakes import FakeEffects


def make(replicas=1, target=1, **fairness):
    effects = FakeEffects()
    scheduler = Scheduler(FairnessSettings(**fairness), effects)
    scheduler.open(replicas, target)
    return scheduler, effects


def test_dispatch_spreads_over_replicas_up_to_the_target():
    scheduler, effects = make(replicas=2, target=1)
    tickets = [Ticket(f"r{i}", None) for i in range(3)]
    for ticket in tickets:
        scheduler.on_request(ticket)
    assert effects.log == [("start", "r0", 0), ("start", "r1", 1)]
    assert (scheduler.queue_depth, scheduler.inflight) == (1, 2)
    scheduler.on_done(tickets[1])
    assert effects.log[-1] == ("start", "r2", 1)


def test_limits_reject_and_count():
    scheduler, _ = make(per_key_queue_limit=1, executor_queue_limit=2)
    scheduler.on_request(Ticket("running", "a"))
    scheduler.on_request(Ticket("a1", "a"))
    with pytest.raises(FairnessKeyQueueFull):
        scheduler.on_request(Ticket("a2", "a"))
    scheduler.on_request(Ticket("b1", "b"))
    with pytest.raises(ExecutorQueueFull):
        scheduler.on_request(Ticket("c1", "c"))
    assert (scheduler.rejected_per_key_limit, scheduler.rejected_executor_limit) == (1, 1)
    report = {row["key"]: row for row in scheduler.key_report()}
    assert report["a"]["pending"] == 1 and report["a"]["active"] == 1 and report["a"]["rejected"] == 1
    assert report["c"]["rejected"] == 1


def test_close_rejects_everything_queued_and_cancel_withdraws():
    scheduler, effects = make()
    running, waiting, withdrawn = Ticket("run", None), Ticket("wait", None), Ticket("gone", None)
    for ticket in (running, waiting, withdrawn):
        scheduler.on_request(ticket)
    assert scheduler.on_cancel(withdrawn) is True
    assert scheduler.on_cancel(running) is False
    scheduler.close(ModelUnloading("bye"))
    assert effects.log == [("start", "run", 0), ("reject", "wait", "model_unloading")]
    assert scheduler.queue_depth == 0 and scheduler.inflight == 1
    scheduler.on_done(running)
    assert (scheduler.queue_depth, scheduler.inflight) == (0, 0)


def served_order(scheduler, effects, tokens_of):
    """Finish each started request in turn (with its real token count) and return the start order."""
    order = []
    while True:
        started = [entry for entry in effects.log if entry[0] == "start"]
        if len(started) == len(order):
            return order
        request_id = started[len(order)][1]
        order.append(request_id)
        running = [t for tickets in scheduler.active.values() for t in tickets if t.request_id == request_id]
        for ticket in running:  # requests the test already finished are not running any more
            scheduler.on_done(ticket, tokens_of(request_id))


def blocked(**fairness):
    """A one-slot scheduler whose slot is held by a zero-cost request, so everything else queues."""
    scheduler, effects = make(**fairness)
    blocker = Ticket("blocker", "z")
    scheduler.on_request(blocker)
    return scheduler, effects, blocker


def test_weights_share_tokens_by_virtual_counter():
    scheduler, effects, blocker = blocked(weights={"b": 3.0})
    for key in ("a", "b"):
        for index in range(1, 5):
            scheduler.on_request(Ticket(f"{key}{index}", key, cost_estimate=10))
    scheduler.on_done(blocker, 0)
    order = served_order(scheduler, effects, lambda rid: 10)
    assert order == ["blocker", "a1", "b1", "b2", "b3", "a2", "b4", "a3", "a4"]


def test_a_request_s_own_weight_shares_tokens_and_outranks_the_settings_weight():
    """A database key's weight comes on its requests: weight 2 is served twice the tokens of weight 1
    while both wait, whatever ``engine.fairness.weights`` says of its fairness key."""
    scheduler, effects, blocker = blocked(weights={"heavy": 0.5})
    for index in range(1, 5):
        scheduler.on_request(Ticket(f"l{index}", "light", cost_estimate=10))
    for index in range(1, 5):
        scheduler.on_request(Ticket(f"h{index}", "heavy", cost_estimate=10, weight=2.0))
    assert {row["key"]: row["weight"] for row in scheduler.key_report()} == {"light": 1.0, "heavy": 2.0, "z": 1.0}
    scheduler.on_done(blocker, 0)
    order = served_order(scheduler, effects, lambda rid: 10)
    assert order == ["blocker", "l1", "h1", "h2", "l2", "h3", "h4", "l3", "l4"]
    # Without a weight of its own, the request takes its key's weight from engine.fairness.
    scheduler.on_request(Ticket("h5", "heavy", cost_estimate=10))
    assert scheduler.keys["heavy"].weight == 0.5


def test_a_key_that_becomes_backlogged_is_lifted_to_the_current_minimum():
    scheduler, effects, blocker = blocked()
    for index in range(1, 6):
        scheduler.on_request(Ticket(f"a{index}", "a", cost_estimate=10))
    scheduler.on_done(blocker, 0)
    for _ in range(3):  # a1, a2, a3 run; a's counter reaches 30
        running = next(iter(scheduler.active[0]))
        scheduler.on_done(running, 10)
    scheduler.on_request(Ticket("b1", "b", cost_estimate=10))
    assert scheduler.keys["b"].counter == scheduler.keys["a"].counter == 40
    order = served_order(scheduler, effects, lambda rid: 10)
    # Without the lift, b (counter 0) would jump ahead of every queued request of a.
    # With it, b ties with a's counter and the earlier-queued a5 goes first.
    assert [rid for rid in order if rid != "blocker"] == ["a1", "a2", "a3", "a4", "a5", "b1"]


def test_real_token_counts_correct_the_prompt_estimate():
    scheduler, effects, blocker = blocked()
    scheduler.on_request(Ticket("a1", "a", cost_estimate=1))
    scheduler.on_request(Ticket("a2", "a", cost_estimate=1))
    scheduler.on_request(Ticket("b1", "b", cost_estimate=1))
    scheduler.on_request(Ticket("b2", "b", cost_estimate=1))
    scheduler.on_done(blocker, 0)
    # a1 really used 100 tokens, so b gets both of its turns before a2.
    order = served_order(scheduler, effects, lambda rid: 100 if rid == "a1" else 1)
    assert order == ["blocker", "a1", "b1", "b2", "a2"]


def test_cancelling_a_queued_head_lets_the_next_request_of_its_key_take_its_place():
    scheduler, effects, blocker = blocked()
    a1, a2, b1 = Ticket("a1", "a", cost_estimate=5), Ticket("a2", "a", cost_estimate=5), Ticket("b1", "b", cost_estimate=5)
    for ticket in (a1, a2, b1):
        scheduler.on_request(ticket)
    assert scheduler.on_cancel(a1) is True
    assert scheduler.queue_depth == 2
    scheduler.on_done(blocker, 0)
    assert served_order(scheduler, effects, lambda rid: 5) == ["blocker", "a2", "b1"]


def test_a_flood_delays_another_key_by_at_most_one_request():
    scheduler, effects, blocker = blocked(per_key_queue_limit=1000, executor_queue_limit=2000)
    for index in range(500):
        scheduler.on_request(Ticket(f"flood{index}", "flood", cost_estimate=20))
    scheduler.on_done(blocker, 0)
    for _ in range(50):
        scheduler.on_done(next(iter(scheduler.active[0])), 20)
    scheduler.on_request(Ticket("polite", "polite", cost_estimate=20))
    scheduler.on_done(next(iter(scheduler.active[0])), 20)
    scheduler.on_done(next(iter(scheduler.active[0])), 20)
    started = [entry[1] for entry in effects.log if entry[0] == "start"]
    assert "polite" in started[-2:]


def test_unload_reset_forgets_counters():
    scheduler, _, blocker = blocked()
    scheduler.on_done(blocker, 50)
    assert scheduler.keys["z"].counter == 50
    scheduler.reset()
    assert scheduler.keys == {} and scheduler.key_report() == []
