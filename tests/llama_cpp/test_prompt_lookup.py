"""Prompt lookup's drafts (``ngram-simple``), without a model: what followed the latest earlier
match of the history's last n-gram, the longest n-gram first."""
from __future__ import annotations

from runtime.backends.llama_cpp.speculative import NgramDrafter


def test_prompt_lookup_drafts_what_followed_the_latest_match_of_the_longest_ngram():
    drafter = NgramDrafter(size_n=3, n_max=4)
    history = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 6, 1, 2, 3]
    assert drafter.propose(history, limit=10) == [4, 5, 9, 2]  # "1 2 3" at the start, not "2 3" after 9
    history += [7, 8]
    assert drafter.propose(history, limit=2) == [6, 1]  # "3 7 8" matched, the draft cut to the limit


def test_prompt_lookup_drafts_nothing_without_a_match():
    drafter = NgramDrafter(size_n=2, n_max=4)
    assert drafter.propose([5, 6, 7], limit=4) == []
    assert drafter.propose([5, 6, 7, 5], limit=0) == []

