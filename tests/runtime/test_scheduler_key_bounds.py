"""The scheduler keeps per-key state only for busy keys plus a bounded record of idle ones."""
import tracemalloc

from runtime.config import FairnessSettings
from runtime.model.scheduler import IDLE_KEYS_RETAINED, Scheduler
from runtime.model.tickets import Ticket


class Started:
    def __init__(self):
        self.order = []

    def start(self, ticket, replica):
        self.order.append(ticket.request_id)

    def reject(self, ticket, error):
        raise AssertionError(f"unexpected rejection of {ticket.request_id}")


def one_slot():
    effects = Started()
    scheduler = Scheduler(FairnessSettings(), effects)
    scheduler.open(1, 1)
    return scheduler, effects


def test_many_unique_keys_leave_a_bounded_record():
    scheduler, _ = one_slot()
    for index in range(IDLE_KEYS_RETAINED * 3):
        ticket = Ticket(f"r{index}", f"key-{index}", cost_estimate=5)
        scheduler.on_request(ticket)
        scheduler.on_done(ticket, 10)
    assert len(scheduler.keys) == IDLE_KEYS_RETAINED
    # The most recently active keys are the ones remembered.
    assert f"key-{IDLE_KEYS_RETAINED * 3 - 1}" in scheduler.keys and "key-0" not in scheduler.keys
    assert scheduler.queue_depth == scheduler.inflight == 0


def test_an_idle_key_at_the_floor_without_rejections_is_forgotten_at_once():
    scheduler, _ = one_slot()
    ticket = Ticket("r0", "free", cost_estimate=0)
    scheduler.on_request(ticket)
    scheduler.on_done(ticket, 0)
    assert "free" not in scheduler.keys


def test_an_idle_heavy_key_keeps_its_counter_so_a_light_key_goes_first():
    scheduler, effects = one_slot()
    heavy = Ticket("h0", "heavy", cost_estimate=10)
    scheduler.on_request(heavy)
    scheduler.on_done(heavy, 500)  # heavy is idle now, its counter 500 remembered
    assert scheduler.keys["heavy"].counter == 500 and not scheduler.keys["heavy"].pending
    blocker = Ticket("block", "other", cost_estimate=0)
    scheduler.on_request(blocker)
    for ticket in (Ticket("l1", "light", cost_estimate=10), Ticket("l2", "light", cost_estimate=10),
                   Ticket("h1", "heavy", cost_estimate=10)):
        scheduler.on_request(ticket)
    running = blocker
    for _ in range(3):
        scheduler.on_done(running, 10)
        running = next(iter(scheduler.active[0]))
    # Remembered at 500, heavy waits for both of light's requests; a forgotten heavy key would be
    # lifted to light's counter (0) and go before l2.
    assert effects.order == ["h0", "block", "l1", "l2", "h1"]


def test_the_idle_records_are_small():
    """4,096 idle keys (the bound, per model) in well under 2 MiB: each record once held a deque
    of its own (760 bytes), and the soak's RSS grew 1.1 KiB for every fairness key it used."""
    scheduler, _ = one_slot()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for index in range(IDLE_KEYS_RETAINED):
            ticket = Ticket(f"r{index}", f"{index:032x}", cost_estimate=5)  # a uuid4().hex's length
            scheduler.on_request(ticket)
            scheduler.on_done(ticket, 10)
        grown = sum(stat.size_diff for stat in tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
    assert len(scheduler.keys) == IDLE_KEYS_RETAINED
    assert grown < 2 * 1024 * 1024, f"{grown / IDLE_KEYS_RETAINED:.0f} bytes per idle key"
    # A key that comes back gets a queue again and is served.
    again = Ticket("again", f"{7:032x}", cost_estimate=5)
    scheduler.on_request(again)
    assert scheduler.inflight == 1
    scheduler.on_done(again, 10)
