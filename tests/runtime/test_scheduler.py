"""The scheduler's decisions, driven synchronously with a fake effects object."""
import pytest

from runtime.config import FairnessSettings
from runtime.errors import ExecutorQueueFull, FairnessKeyQueueFull, ModelUnloading
from runtime.scheduler import Scheduler, Ticket


class FakeEffects:
    def __init__(self):
        self.log = []

    def start(self, ticket, replica):
        self.log.append(("start", ticket.request_id, replica))

    def reject(self, ticket, error):
        self.log.append(("reject", ticket.request_id, error.code))


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
    assert scheduler.idle()
