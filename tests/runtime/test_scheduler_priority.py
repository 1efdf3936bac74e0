"""Priority classes and queue deadlines in the scheduler, driven synchronously with a fake."""
import random

from runtime.config import FairnessSettings
from runtime.errors import ModelUnloading
from runtime.queue_terms import PRIORITY_CLASSES
from runtime.model.scheduler import Scheduler
from runtime.model.tickets import Ticket


class FakeEffects:
    def __init__(self):
        self.log = []

    def start(self, ticket, replica):
        self.log.append(("start", ticket.request_id))

    def reject(self, ticket, error):
        self.log.append(("reject", ticket.request_id, error.code))

    def started(self):
        return [entry[1] for entry in self.log if entry[0] == "start"]


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def blocked(limit=8, **fairness):
    """A one-slot scheduler whose slot is held by a zero-cost request, so everything else queues."""
    effects, clock = FakeEffects(), FakeClock()
    settings = FairnessSettings(per_key_queue_limit=1000, executor_queue_limit=5000,
                                priority_starvation_limit=limit, **fairness)
    scheduler = Scheduler(settings, effects, clock=clock)
    scheduler.open(1, 1)
    blocker = Ticket("blocker", "z")
    scheduler.on_request(blocker)
    return scheduler, effects, clock, blocker


def finish_running(scheduler, tokens=20):
    """End the request that holds the one slot; the scheduler starts the next."""
    scheduler.on_done(next(iter(scheduler.active[0])), tokens)


def test_a_batch_flood_delays_an_interactive_request_by_at_most_one_request():
    scheduler, effects, _, blocker = blocked()
    for index in range(600):  # three batch keys flood the queue
        scheduler.on_request(Ticket(f"batch{index}", f"job{index % 3}", cost_estimate=20, priority="batch"))
    scheduler.on_done(blocker, 0)
    for _ in range(40):
        finish_running(scheduler)
    scheduler.on_request(Ticket("chat", "alice", cost_estimate=20, priority="interactive"))
    assert "chat" not in effects.started()  # the batch request holding the slot goes on
    finish_running(scheduler)
    assert effects.started()[-1] == "chat"  # the next start: one batch request's service later
    # In first-in-first-out order it would have waited for the 560 queued batch requests.
    assert scheduler.queue_depth == 559


def test_a_default_request_goes_before_batch_and_after_interactive():
    scheduler, effects, _, blocker = blocked()
    for rid, key, priority in [("b1", "a", "batch"), ("d1", "b", "default"), ("i1", "c", "interactive"),
                               ("b2", "d", "batch"), ("i2", "e", "interactive"), ("d2", "f", "default")]:
        scheduler.on_request(Ticket(rid, key, cost_estimate=10, priority=priority))
    scheduler.on_done(blocker, 0)
    for _ in range(6):
        finish_running(scheduler, 10)
    assert effects.started() == ["blocker", "i1", "i2", "d1", "d2", "b1", "b2"]


def test_the_batch_class_still_progresses_within_the_starvation_bound():
    scheduler, effects, _, blocker = blocked(limit=3)
    for index in range(4):
        scheduler.on_request(Ticket(f"b{index}", "jobs", cost_estimate=10, priority="batch"))
    for index in range(20):
        scheduler.on_request(Ticket(f"i{index}", f"user{index % 4}", cost_estimate=10, priority="interactive"))
    scheduler.on_done(blocker, 0)
    for _ in range(14):
        finish_running(scheduler, 10)
    started = effects.started()[1:]
    # Three interactive starts while batch waits, then one batch start: the rule's limit of 3.
    assert [rid[0] for rid in started] == list("iiibiiibiiibiii")
    assert [rid for rid in started if rid.startswith("b")] == ["b0", "b1", "b2"]


def test_within_a_class_the_virtual_token_counter_order_holds():
    scheduler, effects, _, blocker = blocked(weights={"heavy": 3.0})
    for key in ("light", "heavy"):
        for index in range(1, 5):
            scheduler.on_request(Ticket(f"{key}{index}", key, cost_estimate=10, priority="interactive"))
    scheduler.on_request(Ticket("batch1", "light", cost_estimate=10, priority="batch"))
    scheduler.on_done(blocker, 0)
    for _ in range(9):
        finish_running(scheduler, 10)
    # The order test_scheduler's weights test gives without classes, then the batch request.
    assert effects.started()[1:] == ["light1", "heavy1", "heavy2", "heavy3", "light2", "heavy4", "light3",
                                     "light4", "batch1"]


def test_one_key_in_two_classes_keeps_one_counter_and_its_interactive_request_goes_first():
    scheduler, effects, _, blocker = blocked()
    scheduler.on_request(Ticket("own-batch", "alice", cost_estimate=10, priority="batch"))
    scheduler.on_request(Ticket("own-chat", "alice", cost_estimate=10, priority="interactive"))
    scheduler.on_request(Ticket("bob-batch", "bob", cost_estimate=10, priority="batch"))
    assert [row["pending"] for row in scheduler.key_report() if row["key"] == "alice"] == [2]
    scheduler.on_done(blocker, 0)
    finish_running(scheduler, 50)  # alice's chat really cost 50: her counter is one over her classes
    finish_running(scheduler, 10)
    assert effects.started() == ["blocker", "own-chat", "bob-batch", "own-batch"]


def test_a_lower_class_is_never_passed_over_past_the_bound():
    """Random arrivals in every class and random service: while a class has a queued request, at
    most limit + 1 starts in a row come from the other classes (docs/scheduling.md)."""
    limit = 4
    rng = random.Random(7)
    scheduler, effects, _, blocker = blocked(limit=limit)
    scheduler.on_done(blocker, 0)
    scheduler.open(2, 2)
    class_of, passed = {}, dict.fromkeys(PRIORITY_CLASSES, 0)
    worst = dict(passed)

    def waiting():
        return {cls for cls, depth in zip(PRIORITY_CLASSES, scheduler.turns.depth) if depth}

    for index in range(4000):
        before, queued = len(effects.log), waiting()
        if rng.random() < 0.52:
            priority = rng.choices(PRIORITY_CLASSES, weights=(5, 3, 2))[0]
            class_of[f"r{index}"] = priority
            scheduler.on_request(Ticket(f"r{index}", f"k{rng.randrange(6)}", cost_estimate=rng.randint(1, 50),
                                        priority=priority))
        elif scheduler.inflight:
            running = rng.choice([t for tickets in scheduler.active.values() for t in tickets])
            scheduler.on_done(running, rng.randint(1, 200))
        for _, request_id in effects.log[before:]:
            for cls in queued - {class_of[request_id]}:
                passed[cls] += 1
                worst[cls] = max(worst[cls], passed[cls])
            passed[class_of[request_id]] = 0
        for cls in set(PRIORITY_CLASSES) - waiting():
            passed[cls] = 0
    assert limit <= worst["batch"] <= limit + 1
    assert worst["default"] <= limit + 1
    assert worst["interactive"] <= 2  # a due default start, then a due batch start


def test_an_expired_ticket_never_starts_and_the_next_starts_at_once():
    scheduler, effects, clock, blocker = blocked()
    scheduler.on_request(Ticket("late", "a", cost_estimate=10, deadline=clock.now + 5))
    scheduler.on_request(Ticket("also-late", "b", cost_estimate=10, priority="interactive", deadline=clock.now + 1))
    scheduler.on_request(Ticket("patient", "c", cost_estimate=10))
    scheduler.on_request(Ticket("in-time", "d", cost_estimate=10, deadline=clock.now + 60))
    clock.now += 10
    scheduler.on_done(blocker, 0)
    assert effects.log[1:] == [
        ("reject", "also-late", "queue_deadline_exceeded"),
        ("reject", "late", "queue_deadline_exceeded"),
        ("start", "patient"),
    ]
    assert scheduler.queue_depth == 1 and scheduler.inflight == 1
    assert {row["key"] for row in scheduler.key_report()} >= {"c", "d"}
    finish_running(scheduler)
    assert effects.log[-1] == ("start", "in-time")
    assert "a" not in scheduler.keys or scheduler.keys["a"].pending == 0


def test_a_request_that_can_start_at_once_meets_no_deadline_check_it_could_fail():
    effects, clock = FakeEffects(), FakeClock()
    scheduler = Scheduler(FairnessSettings(), effects, clock=clock)
    scheduler.open(1, 1)
    scheduler.on_request(Ticket("now", "a", cost_estimate=5, deadline=clock.now + 0.001))
    assert effects.log == [("start", "now")]


def test_cancel_and_close_reach_every_class():
    scheduler, effects, _, blocker = blocked()
    tickets = {priority: Ticket(f"{priority}1", "k", priority=priority) for priority in PRIORITY_CLASSES}
    for ticket in tickets.values():
        scheduler.on_request(ticket)
    assert scheduler.turns.depth == [1, 1, 1]
    assert scheduler.on_cancel(tickets["default"]) is True
    assert scheduler.turns.depth == [1, 0, 1] and scheduler.keys["k"].pending == 2
    scheduler.close(ModelUnloading("bye"))
    assert effects.log[1:] == [("reject", "interactive1", "model_unloading"), ("reject", "batch1", "model_unloading")]
    assert scheduler.queue_depth == 0 and scheduler.turns.depth == [0, 0, 0] and scheduler.lanes == {}
