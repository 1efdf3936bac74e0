"""Prompt lookup's drafts (``ngram-simple``), without a model: what followed the latest earlier
match of the history's last n-gram of ``size_n`` tokens, as llama.cpp's ngram-simple drafts."""
from __future__ import annotations

from runtime.backends.llama_cpp.speculative import NgramDrafter


def test_prompt_lookup_drafts_what_followed_the_latest_match_of_the_ngram():
    drafter = NgramDrafter(size_n=3, n_max=4)
    history = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 6, 1, 2, 3]
    assert drafter.propose(history, limit=10) == [4, 5, 9, 2]  # "1 2 3" at the start, not "2 3" after 9
    history += [7, 8]
    assert drafter.propose(history, limit=2) == [6, 1]  # "3 7 8" matched, the draft cut to the limit
    history += [4, 4, 1, 2, 3, 4, 5, 9, 2, 3]
    assert drafter.propose(history, limit=10) == [7, 8, 6, 1]  # the latest match of "9 2 3"


def test_prompt_lookup_tries_no_shorter_ngram():
    """Only the whole n-gram is looked up: "2 3" and "3" occurred before, "9 2 3" did not."""
    drafter = NgramDrafter(size_n=3, n_max=4)
    assert drafter.propose([1, 2, 3, 4, 5, 6, 7, 8, 9, 2, 3], limit=4) == []


def test_prompt_lookup_drafts_nothing_when_fewer_than_n_tokens_follow_the_match():
    """What follows the match, up to the history's last token (the one being decoded) and not it."""
    drafter = NgramDrafter(size_n=3, n_max=4)
    assert drafter.propose([5, 1, 2, 3, 1, 2, 3], limit=4) == []  # "1 2" only: two of three
    assert drafter.propose([5, 1, 2, 3, 9, 1, 2, 3], limit=4) == [9, 1, 2]
    assert drafter.propose([5, 1, 2, 3, 9, 1, 2, 3], limit=2) == [9, 1]  # a limit under n still drafts


def test_prompt_lookup_drafts_nothing_without_a_match():
    drafter = NgramDrafter(size_n=2, n_max=4)
    assert drafter.propose([5, 6, 7], limit=4) == []
    assert drafter.propose([5, 6, 7, 5], limit=0) == []

