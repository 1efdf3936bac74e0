"""What a request queues with: its priority class, how long it may wait (its queue timeout), and
the fairness weight of its key.

A class is one of ``PRIORITY_CLASSES``, highest first.  The scheduler serves the highest class
with a queued request, Virtual Token Counter order within it, except for the turn the starvation
rule (``runtime.model.class_turns``) gives a lower class.  A queue timeout is a number of
seconds, above 0 and at most ``MAX_QUEUE_TIMEOUT_SECONDS``; a request still queued after it is
dropped before it starts.  A weight is a number above 0 and at most ``MAX_WEIGHT``: the scheduler
divides the tokens a request is charged by it.
"""
from __future__ import annotations

from runtime.errors import QueueDeadlineExceeded

PRIORITY_CLASSES = ("interactive", "default", "batch")
DEFAULT_PRIORITY = "default"
RANKS = {name: rank for rank, name in enumerate(PRIORITY_CLASSES)}  # 0 is served first

MAX_QUEUE_TIMEOUT_SECONDS = 86_400
MAX_WEIGHT = 1000


def deadline_passed() -> QueueDeadlineExceeded:
    """The error of a request dropped at its deadline, unstarted (503 queue_deadline_exceeded)."""
    return QueueDeadlineExceeded("the request waited for a replica past its queue deadline; it was not started")
