"""Prefix-affinity routing: the scheduler's replica choice driven synchronously with a fake
effects object (runtime.model.routing), and the conversation marks it matches
(runtime.inference.prefix_marks)."""
import dataclasses

from runtime.config import FairnessSettings
from runtime.errors import ModelUnloading
from runtime.inference.prefix_marks import RAW_BLOCK_CHARS, prefix_marks
from runtime.inputs.request import GenerationRequest
from runtime.model.scheduler import Scheduler
from runtime.model.tickets import Ticket
from tests.runtime.scheduler_fakes import FakeEffects


def make(replicas=2, target=1, cached=1, load_factor=1.25):
    effects = FakeEffects()
    scheduler = Scheduler(FairnessSettings(), effects)
    scheduler.open(replicas, target, cached, load_factor)
    return scheduler, effects


def message(role, text):
    return {"role": role, "content": [{"type": "input_text", "text": text}]}


def conversation(name, turns):
    """The messages of conversation ``name`` at its turn ``turns`` (1: the first user message)."""
    messages = [message("system", f"You help {name}."), message("user", f"{name} asks 1")]
    for turn in range(2, turns + 1):
        messages += [message("assistant", f"answer {turn - 1} to {name}"), message("user", f"{name} asks {turn}")]
    return messages


def turn(name, number, key=None):
    request = GenerationRequest(f"{name}{number}", conversation(name, number))
    return Ticket(request.request_id, key or name, prefix=prefix_marks(request))


def run(scheduler, ticket):
    """Queue ``ticket``; the replica it started on (None: it waits)."""
    scheduler.on_request(ticket)
    return ticket.replica


def finish(scheduler, *tickets):
    for ticket in tickets:
        scheduler.on_done(ticket, 10)


# ---- the marks ------------------------------------------------------------------------------------

def test_a_later_turn_starts_with_every_mark_of_the_earlier_ones():
    first, second, third = (prefix_marks(GenerationRequest("r", conversation("a", n))) for n in (1, 2, 3))
    assert second[: len(first)] == first and third[: len(second)] == second
    assert len(first) == 2 and len(second) == 4  # the system part, then one mark per message
    assert [size for _, size in third] == sorted(size for _, size in third)


def test_the_same_conversation_with_another_lora_adapter_shares_no_mark():
    base = GenerationRequest("b", conversation("ann", 2))
    adapted = dataclasses.replace(base, adapter="sea")
    assert not set(prefix_marks(base)) & set(prefix_marks(adapted))


def test_conversations_share_only_the_marks_of_what_they_share():
    a = prefix_marks(GenerationRequest("r", conversation("a", 2)))
    same_system = prefix_marks(GenerationRequest("r", [message("system", "You help a."), message("user", "other")]))
    assert same_system[0] == a[0] and same_system[1] != a[1]
    # Without a system part the first message is the head: two conversations do not match on nothing.
    x = prefix_marks(GenerationRequest("r", [message("user", "hello")]))
    y = prefix_marks(GenerationRequest("r", [message("user", "bye")]))
    assert x[0] != y[0]
    tools = prefix_marks(GenerationRequest("r", conversation("a", 2), tools=[{"type": "function", "function": {"name": "f"}}]))
    assert tools[0] != a[0]


def test_a_raw_prompt_is_marked_by_blocks_so_a_longer_one_matches_the_blocks_it_repeats():
    prompt = "x" * (RAW_BLOCK_CHARS * 2 + 10)
    short = prefix_marks(GenerationRequest("r", [], prompt=prompt))
    longer = prefix_marks(GenerationRequest("r", [], prompt=prompt + "y" * 100))
    assert len(short) == 3 and longer[:2] == short[:2] and longer[2] != short[2]
    assert prefix_marks(GenerationRequest("r", [])) == ()


# ---- the routing ----------------------------------------------------------------------------------

def test_a_conversation_goes_back_to_the_replica_that_served_it():
    scheduler, _ = make()
    a1, b1 = turn("a", 1), turn("b", 1)
    assert (run(scheduler, a1), run(scheduler, b1)) == (0, 1)
    finish(scheduler, a1, b1)
    # Both replicas idle: least-loaded alone would send b's next turn to replica 0.
    b2, a2 = turn("b", 2), turn("a", 2)
    assert run(scheduler, b2) == 1
    assert run(scheduler, a2) == 0


def test_without_remembered_prefixes_the_least_loaded_lowest_replica_serves():
    scheduler, _ = make(cached=0)
    a1, b1 = turn("a", 1), turn("b", 1)
    run(scheduler, a1), run(scheduler, b1)
    finish(scheduler, a1, b1)
    assert run(scheduler, turn("b", 2)) == 0


def test_a_request_waits_for_its_busy_replica_within_the_load_bound():
    scheduler, effects = make()
    c1 = turn("c", 1)
    run(scheduler, c1)
    c2 = turn("c", 2)  # replica 0 holds c and is busy, replica 1 idles: wait, 1 + 1 <= ceil(1.25 * 2 / 2)
    assert run(scheduler, c2) is None and c2.waits_for == 0
    assert (scheduler.queue_depth, scheduler.inflight) == (1, 1)
    assert scheduler.key_report()[0]["pending"] == 1
    finish(scheduler, c1)
    assert effects.log[-1] == ("start", "c2", 0)


def test_past_the_load_bound_a_request_goes_to_a_free_replica():
    scheduler, _ = make(load_factor=1.0)  # never above the average: no waiting while a replica idles
    run(scheduler, turn("c", 1))
    assert run(scheduler, turn("c", 2)) == 1
    scheduler, _ = make(cached=4)
    c1, d1 = turn("c", 1), turn("d", 1)
    run(scheduler, c1), run(scheduler, d1)
    finish(scheduler, d1)
    assert run(scheduler, turn("c", 2, key="k1")) is None
    # A second one would make replica 0's load 3, past ceil(1.25 * 3 / 2) = 2.
    assert run(scheduler, turn("c", 2, key="k2")) == 1


def test_a_replica_remembers_only_what_its_cache_keeps():
    def after_three_conversations(cached):
        scheduler, _ = make(cached=cached)
        firsts = [turn(name, 1) for name in "abc"]
        for ticket in firsts:  # the least recently used replica takes each new conversation
            run(scheduler, ticket)
            if ticket is not firsts[-1]:
                finish(scheduler, ticket)
        assert [t.replica for t in firsts] == [0, 1, 0]
        return scheduler

    # Replica 0 (busy with c) keeps a too: a's next turn waits for it.
    assert run(after_three_conversations(cached=2), turn("a", 2)) is None
    # It keeps c only: a is cached nowhere and goes to the free replica.
    assert run(after_three_conversations(cached=1), turn("a", 2)) == 1


def test_a_waiting_request_can_be_withdrawn_and_is_rejected_on_close():
    scheduler, effects = make(load_factor=4.0)  # a bound loose enough for two to wait
    run(scheduler, turn("c", 1))
    withdrawn, rejected = turn("c", 2, key="k1"), turn("c", 2, key="k2")
    run(scheduler, withdrawn), run(scheduler, rejected)
    assert withdrawn.waits_for == rejected.waits_for == 0
    assert scheduler.on_cancel(withdrawn) is True and scheduler.queue_depth == 1
    scheduler.close(ModelUnloading("bye"))
    assert effects.log[-1] == ("reject", "c2", "model_unloading")
    assert scheduler.queue_depth == 0 and "k1" not in scheduler.keys


def test_the_requests_waiting_for_a_failed_replica_go_to_the_others():
    scheduler, effects = make()
    c1 = turn("c", 1)
    run(scheduler, c1)
    c2 = turn("c", 2)
    assert run(scheduler, c2) is None
    scheduler.retire(0)
    assert effects.log[-1] == ("start", "c2", 1) and scheduler.queue_depth == 0


def test_a_paused_scheduler_starts_no_waiting_request_until_it_resumes():
    scheduler, effects = make()
    c1 = turn("c", 1)
    run(scheduler, c1)
    run(scheduler, turn("c", 2))
    scheduler.pause()
    finish(scheduler, c1)
    assert effects.log[-1] == ("start", "c1", 0)
    scheduler.resume()
    assert effects.log[-1] == ("start", "c2", 0)


def test_a_request_waiting_for_its_replica_keeps_its_class_and_deadline():
    scheduler, effects = make()
    now = [0.0]
    scheduler.clock = lambda: now[0]
    c1 = turn("c", 1)
    run(scheduler, c1)
    c2 = turn("c", 2)
    c2.priority, c2.deadline = "interactive", 5.0
    assert run(scheduler, c2) is None and c2.waits_for == 0
    assert scheduler.turns.depth == [0, 0, 0]  # out of its class's lane while it waits
    assert scheduler.key_report()[0]["pending"] == 1
    now[0] = 6.0  # past its deadline when its replica frees: dropped, never started
    finish(scheduler, c1)
    assert effects.log[-1] == ("reject", "c2", "queue_deadline_exceeded")
    assert (scheduler.queue_depth, scheduler.inflight) == (0, 0)
    assert scheduler.keys == {} or scheduler.key_report()[0]["pending"] == 0


def test_a_waiting_request_requeued_from_a_failed_replica_returns_to_its_class():
    scheduler, effects = make()
    c1 = turn("c", 1)
    run(scheduler, c1)
    c2 = turn("c", 2)
    c2.priority = "batch"
    assert run(scheduler, c2) is None
    scheduler.retire(0)  # its replica failed: back in the batch lane, then routed to replica 1
    assert effects.log[-1] == ("start", "c2", 1)
    assert scheduler.turns.depth == [0, 0, 0] and scheduler.queue_depth == 0
