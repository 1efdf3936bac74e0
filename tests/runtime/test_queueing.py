"""The runtime's side of a request's queue terms (``runtime.model.queueing``): the ticket's
class and deadline from the request and its model's definition, the values it refuses, and the
wait that ends at the deadline."""
from __future__ import annotations

import asyncio
import time

import pytest

from runtime.backends.stub.spec import StubDefinition
from runtime.errors import InvalidPriority, InvalidQueueTimeout, InvalidRequest, QueueDeadlineExceeded
from runtime.inference.embedding import EmbeddingRequest
from runtime.model.queueing import before_deadline, queue_ticket
from runtime.inputs.request import GenerationRequest
from runtime.model.tickets import Ticket
from tests.engines.runtime_driver import user_input


def request(**fields) -> GenerationRequest:
    return GenerationRequest("r1", [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}], **fields)


def definition(**fields) -> StubDefinition:
    return StubDefinition(backend="stub", **fields)


def test_the_ticket_carries_the_class_and_a_deadline_from_the_header_or_the_model():
    ticket = queue_ticket(request(priority="batch", fairness_key="k"), definition(), 7, received=100.0)
    assert (ticket.priority, ticket.fairness_key, ticket.cost_estimate, ticket.deadline) == ("batch", "k", 7, None)
    assert queue_ticket(request(), definition(queue_timeout_seconds=5), 1, received=100.0).deadline == 105.0
    assert queue_ticket(request(queue_timeout_seconds=0.5), definition(queue_timeout_seconds=5), 1,
                        received=100.0).deadline == 100.5
    embedding = EmbeddingRequest("e1", "m", ["a"], priority="interactive", queue_timeout_seconds=2)
    assert queue_ticket(embedding, definition(), 1, received=10.0).deadline == 12.0


def test_the_ticket_carries_the_key_s_weight_from_the_wire():
    """A database key's weight crosses the channel layer in the request's wire dict (the split)."""
    wire = {**request(fairness_key="k").to_wire(), "weight": 2.5, "newer_field": 1}
    assert queue_ticket(GenerationRequest.from_wire(wire), definition(), 1, received=0.0).weight == 2.5
    assert queue_ticket(request(), definition(), 1, received=0.0).weight is None
    embedding = EmbeddingRequest.from_wire({"request_id": "e1", "model": "m", "inputs": ["a"], "weight": 3})
    assert queue_ticket(embedding, definition(), 1, received=0.0).weight == 3


@pytest.mark.parametrize("fields, error", [
    ({"priority": "urgent"}, InvalidPriority),
    ({"queue_timeout_seconds": -1}, InvalidQueueTimeout),
    ({"queue_timeout_seconds": 0}, InvalidQueueTimeout),
    ({"queue_timeout_seconds": float("inf")}, InvalidQueueTimeout),
    ({"queue_timeout_seconds": True}, InvalidQueueTimeout),
    ({"queue_timeout_seconds": "5"}, InvalidQueueTimeout),
    ({"queue_timeout_seconds": 10**9}, InvalidQueueTimeout),
    ({"weight": 0}, InvalidRequest),
    ({"weight": -2}, InvalidRequest),
    ({"weight": float("nan")}, InvalidRequest),
    ({"weight": True}, InvalidRequest),
    ({"weight": "2"}, InvalidRequest),
    ({"weight": 1001}, InvalidRequest),
])
def test_what_the_edge_refuses_the_runtime_refuses_too(fields, error):
    with pytest.raises(error):
        queue_ticket(request(**fields), definition(), 1, received=0.0)


async def test_the_wait_ends_at_the_deadline_and_cancels_what_it_awaited():
    never = asyncio.get_running_loop().create_future()
    started = time.monotonic()
    with pytest.raises(QueueDeadlineExceeded):
        await before_deadline(Ticket("r", None, deadline=started + 0.05), never)
    assert time.monotonic() - started >= 0.05 and never.cancelled()


async def test_a_wait_that_ends_in_time_or_has_no_deadline_is_untouched():
    assert await before_deadline(Ticket("r", None, deadline=time.monotonic() + 5), asyncio.sleep(0, "lease")) == "lease"
    assert await before_deadline(Ticket("r", None), asyncio.sleep(0, "lease")) == "lease"

    async def own_timeout():
        raise TimeoutError("the awaited step's own")

    with pytest.raises(TimeoutError, match="own"):
        await before_deadline(Ticket("r", None, deadline=time.monotonic() + 5), own_timeout())


async def test_a_request_waiting_for_its_model_s_load_is_dropped_at_its_deadline(runtime_service):
    service, _ = await runtime_service({"m": {"backend": "stub", "stub_reply": "a b", "load_on_request": True,
                                              "stub_load_seconds": 1.0}})
    controller = service.pool.controller("m")
    payload = {"request_id": "late", "model": "m", "messages": user_input("hi"), "queue_timeout_seconds": 0.2,
               "priority": "batch"}
    started = time.monotonic()
    with pytest.raises(QueueDeadlineExceeded):
        await service.handle("generate", payload, None)
    assert 0.2 <= time.monotonic() - started < 0.9  # at its deadline, not at the load's end
    while controller.waiters:  # its finish reaches the model's writer on a later turn of the loop
        assert time.monotonic() - started < 5, "the dropped request still waits for the load"
        await asyncio.sleep(0.01)
    assert controller.scheduler.queue_depth == 0
