"""Which priority class the next start of a model's scheduler comes from (``ClassTurns``): the
rule that puts higher classes first and bounds how long a lower class waits."""
from __future__ import annotations

from dataclasses import dataclass, field

from runtime.queue_terms import PRIORITY_CLASSES


@dataclass(slots=True)
class ClassTurns:
    """Which class the next start comes from.

    The highest class with a queued request goes first, except that a class passed over
    ``limit`` times in a row while it had a queued request (a dispatch of a higher class counts
    one) is *due*: the next start is the due class passed over most (on a tie, the higher one).
    So a class with a queued request is passed over at most ``limit + len(PRIORITY_CLASSES) - 2``
    starts in a row (``limit + 1`` with three classes): ``limit`` by higher classes, then one
    start of each other due class.
    """

    depth: list[int] = field(default_factory=lambda: [0] * len(PRIORITY_CLASSES))  # queued per class
    passed_over: list[int] = field(default_factory=lambda: [0] * len(PRIORITY_CLASSES))

    def pick(self, limit: int) -> int:
        """The rank the next start comes from; at least one class has a queued request."""
        highest = due = None
        for rank, queued in enumerate(self.depth):
            if not queued:
                continue
            if highest is None:
                highest = rank
            passed = self.passed_over[rank]
            if passed >= limit and (due is None or passed > self.passed_over[due]):
                due = rank
        return highest if due is None else due

    def served(self, rank: int) -> None:
        """A request of ``rank`` started: every lower class that waits was passed over once more."""
        self.passed_over[rank] = 0
        for lower in range(rank + 1, len(self.depth)):
            self.passed_over[lower] = self.passed_over[lower] + 1 if self.depth[lower] else 0

    def clear(self) -> None:
        self.depth = [0] * len(PRIORITY_CLASSES)
        self.passed_over = [0] * len(PRIORITY_CLASSES)
